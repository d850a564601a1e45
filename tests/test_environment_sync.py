"""environment.yml (conda, Linux CPU) must stay in sync with pyproject.toml, the source of truth for
dependencies; the Makefile and .ci/run must offer the entry points the README promises."""

import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
EXTRAS_IN_ENV = ("cpu", "notebooks", "dev")  # what a Linux CPU conda env installs
LINUX = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}


def _key(req: Requirement) -> tuple:
    """What must match: the name (normalised), the extras and the exact specifier (order-insensitive)."""
    return (canonicalize_name(req.name), tuple(sorted(req.extras)), str(SpecifierSet(str(req.specifier))))


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.fixture(scope="module")
def env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


@pytest.fixture(scope="module")
def env_pip(env) -> list[str]:
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) == 1, "environment.yml needs exactly one `pip:` list"
    return [str(x).strip() for x in pips[0]]


def _expand(project: dict, extras, seen=None) -> list[Requirement]:
    """The requirements of `extras`, with self-references such as `pdlib[notebooks]` expanded."""
    seen = set() if seen is None else seen
    optional = project.get("optional-dependencies", {})
    out = []
    for extra in extras:
        assert extra in optional, f"pyproject.toml has no extra {extra!r}"
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                out += _expand(project, sorted(req.extras), seen)
            else:
                out.append(req)
    return out


def _required(project: dict) -> list[Requirement]:
    base = [Requirement(s) for s in project["dependencies"]]
    base = [r for r in base if r.marker is None or r.marker.evaluate(LINUX)]
    return base + _expand(project, EXTRAS_IN_ENV)


def _env_requirements(env_pip: list[str]) -> list[Requirement]:
    return [Requirement(s) for s in env_pip if not s.startswith("-")]


def test_expansion_sees_the_self_reference(project):
    names = {canonicalize_name(r.name) for r in _expand(project, ["dev"])}
    assert "pdlib" not in names
    assert {"pytest", "pandas", "papermill"} <= names  # pandas/papermill come through pdlib[notebooks]


def test_linux_marker_filter_drops_darwin_only_requirements(project):
    reqs = [Requirement(s) for s in project["dependencies"]]
    darwin_only = [r for r in reqs if r.marker is not None and not r.marker.evaluate(LINUX)]
    assert darwin_only, "expected the macOS-only plain `mlx` pin in [project].dependencies"
    required = [str(r) for r in _required(project)]
    for r in darwin_only:
        assert r.marker.evaluate({**LINUX, "sys_platform": "darwin", "platform_system": "Darwin"})
        assert str(r) not in required
    # on Linux, MLX arrives through the cpu extra instead
    assert any(canonicalize_name(Requirement(s).name) == "mlx" and "cpu" in Requirement(s).extras for s in required)


def test_every_pyproject_requirement_is_in_environment_yml(project, env_pip):
    have = {_key(r) for r in _env_requirements(env_pip)}
    missing = [str(r) for r in _required(project) if _key(r) not in have]
    assert not missing, f"environment.yml pip: lacks (or pins differently) {missing}"


def test_environment_yml_has_nothing_pyproject_lacks(project, env_pip):
    want = {_key(r) for r in _required(project)}
    extra = [str(r) for r in _env_requirements(env_pip) if _key(r) not in want]
    assert not extra, f"environment.yml pip: has requirements pyproject.toml does not: {extra}"
    envs = _env_requirements(env_pip)
    assert len({_key(r) for r in envs}) == len(envs), "environment.yml repeats a requirement"


def test_environment_yml_installs_the_project_with_existing_extras(project, env_pip):
    editable = [s for s in env_pip if s.startswith("-")]
    assert len(editable) == 1, editable
    m = re.fullmatch(r"-e\s+\.\[([\w,\s-]+)\]", editable[0])
    assert m, f"expected `-e .[extras]`, got {editable[0]!r}"
    extras = [e.strip() for e in m.group(1).split(",")]
    assert set(extras) <= set(project["optional-dependencies"])
    assert "cpu" in extras and "dev" in extras


def test_environment_python_satisfies_requires_python(project, env):
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and re.match(r"python\b(?!-)", d)]
    assert len(pythons) == 1, pythons
    m = re.fullmatch(r"python\s*(?:==?|>=)?\s*(\d+(?:\.\d+)*)(?:\.\*)?", pythons[0].strip())
    assert m, f"unparsed python spec {pythons[0]!r}"
    version = m.group(1) + (".0" if m.group(1).count(".") == 1 else "")
    requires = SpecifierSet(project["requires-python"])
    assert requires.contains(version), f"{pythons[0]} does not satisfy requires-python {requires}"
    assert "pip" in env["dependencies"]


def test_makefile_has_setup_test_run_targets():
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z_][\w.-]*)\s*:(?!=)", text, flags=re.M))
    promised = {"setup", "test", "test-fast", "lint", "run", "lab", "gpu"}  # the README's
    assert promised <= targets, targets
    phony = re.search(r"^\.PHONY\s*:(.*)$", text, flags=re.M)
    assert phony and promised <= set(phony.group(1).split())
    # `make test` lints first, with the ruff configured in pyproject.toml
    assert re.search(r"^test: setup-test\n\t\$\(LINT\)\n", text, re.M) and "ruff check" in text
    # `make test` must run pytest
    body = re.search(r"^test\s*:.*\n((?:\t.*\n?)+)", text, flags=re.M)
    assert body and "pytest" in body.group(1)


def test_ci_runs_make_test():
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK), ".ci/run must be executable"
    lines = [ln.split("#", 1)[0].strip() for ln in ci.read_text().splitlines()]
    assert ci.read_text().startswith("#!")
    assert any(re.fullmatch(r"(exec\s+)?make\s+test", ln) for ln in lines), lines


def test_make_run_installs_only_what_the_main_job_imports(project):
    run = {canonicalize_name(r.name) for r in _expand(project, ["notebooks"])}
    assert {"papermill", "jupyterlab", "tabulate"} <= run
    assert not run & {"torch", "pytest", "hypothesis", "safetensors"}, run
    test = {canonicalize_name(r.name) for r in _expand(project, ["test"])}
    assert {"torch", "pytest"} <= test and run <= test
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^RUN_EXTRAS := \$\(MLX_EXTRA\)notebooks$", text, re.M)
    assert re.search(r"^TEST_EXTRAS := \$\(MLX_EXTRA\)notebooks,test$", text, re.M)
    assert re.search(r"^run: setup$", text, re.M) and re.search(r"^test: setup-test$", text, re.M)
    assert re.search(r"^lab: setup\n\t\$\(VENV\)/bin/jupyter lab", text, re.M)
