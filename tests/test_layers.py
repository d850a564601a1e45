"""The package's shape: every import (lazy ones included) points down the layers, no module imports another
in a circle, no private name crosses a module boundary, and no module is over ~500 lines."""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "pdlib"
# Lowest first; a module may import its own layer's modules and any below it, never one above.
LAYERS = [
    ("pdlib.errors",),
    ("pdlib.text", "pdlib.tolerance", "pdlib.scheduler", "pdlib.batching", "pdlib.params_file"),
    ("pdlib.config", "pdlib.settings"),
    ("pdlib.prompts", "pdlib.weights", "pdlib.checkpoint", "pdlib.traces", "pdlib.workload"),
    ("pdlib.report",),
    ("pdlib.interrupt",),
    ("pdlib.engine",),
    ("pdlib.run",),
    ("pdlib.tools", "pdlib.analysis"),
    ("pdlib.publish",),
    ("pdlib.cli", "pdlib.__main__", "pdlib"),
]
# analysis reads reports only: it never reaches the engine, a run or a tool (nor MLX, checked elsewhere)
APART = {"pdlib.analysis": ("pdlib.engine", "pdlib.run", "pdlib.tools"), "pdlib.tools": ("pdlib.analysis",)}
MAX_LINES = 520


def _name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _layer(module: str) -> int:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (i, p)
    assert best is not None, f"{module} is in no layer"
    return best[0]


def _resolve(target: str) -> str | None:
    """The pdlib module an import names (a name imported from a package may be a submodule)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _imports(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every pdlib import in `module`, at any depth."""
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(_resolve(a.name), "", node.lineno) for a in node.names if a.name.startswith("pdlib")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pdlib"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, "", node.lineno) if sub in MODULES else (_resolve(node.module), a.name, node.lineno))
    return [o for o in out if o[0] and o[0] != module]


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m)} for m in MODULES}


def test_every_import_points_down_the_layers():
    bad = []
    for m in MODULES:
        for target, _, line in _imports(m):
            above = _layer(target) > _layer(m)
            apart = any(m.startswith(a) and target.startswith(b) for a, bs in APART.items() for b in bs)
            if above or apart:
                bad.append(f"{MODULES[m].relative_to(PKG.parent)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_circle():
    graph, state, path = _graph(), {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                raise AssertionError("import circle: " + " -> ".join(path[path.index(t) :] + [t]))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = "done"

    for m in MODULES:
        if m not in state:
            visit(m)


def test_no_private_name_crosses_a_module():
    bad = [
        f"{MODULES[m].relative_to(PKG.parent)}:{line} imports {t}.{n}"
        for m in MODULES
        for t, n, line in _imports(m)
        if n.startswith("_") and not n.endswith("__")
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_long(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{module}: {n} lines (at most {MAX_LINES})"


def test_the_checks_see_a_planted_fault(monkeypatch):
    """An upward import and a circle, planted, fail the checks above."""
    real = _imports

    def planted(m):
        extra = {"pdlib.errors": [("pdlib.config", "", 1)], "pdlib.config": [("pdlib.errors", "_x", 1)]}
        return real(m) + extra.get(m, [])

    monkeypatch.setitem(globals(), "_imports", planted)
    for check in (
        test_every_import_points_down_the_layers,
        test_no_import_circle,
        test_no_private_name_crosses_a_module,
    ):
        with pytest.raises(AssertionError):
            check()


def test_every_test_listed_as_slow_exists():
    """A renamed test must not drop out of the slow list unnoticed (it would then slow `make test-fast`)."""
    from conftest import SLOW

    tests_dir = PKG.parent / "tests"
    for path, names in SLOW.items():
        defined = {
            n.name for n in ast.walk(ast.parse((tests_dir / path).read_text())) if isinstance(n, ast.FunctionDef)
        }
        assert names == "*" or set(names) <= defined, (path, set(names) - defined)
