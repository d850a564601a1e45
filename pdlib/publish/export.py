"""An executed notebook as one offline HTML page: no CDN scripts, images with alt text (a chart the folder
holds as a PNG file is shown from that file, beside the page; any other image inline), one parameters cell
(papermill's injected one, which the orchestrator fills with every parameter), the notebook's title, and only
the style rules the page can use.

    html = export_html("outputs/local/run/02_analyze_gaps.ipynb")   # -> .html beside it; never overwrites
"""

import re
from pathlib import Path

# JupyterLab's page without its CDN scripts (require.js, MathJax, mermaid): the notebooks use none of
# them, and without them the page loads nothing from the network. PNGs carry the alt text the cell gave
# (nbconvert's own template has none). A reference to a chart's file (charts.refer_to_files) is drawn as an
# inline PNG is, its <img> naming the file: the same page but for the image's source ('pdlib_chart_file' is
# charts.REFERENCE, spelt out: a template is text).
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block data_png scoped %}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
{%- set width = output | get_metadata('width', 'image/png') -%}
{%- if width is not none %} width="{{ width | escape_html }}"{%- endif %}
{%- set height = output | get_metadata('height', 'image/png') -%}
{%- if height is not none %} height="{{ height | escape_html }}"{%- endif %}
{%- set alt = output | get_metadata('alt', 'image/png') %} alt="{{ (alt or 'chart') | escape_html }}">
</div>
{% endblock data_png %}
{% block data_html scoped %}
{%- if output | get_metadata('pdlib_chart_file', 'text/html') %}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
{{ output.data['text/html'] }}
</div>
{%- else %}{{ super() }}{%- endif %}
{% endblock data_html %}
"""


def one_parameters_cell(nb):
    """Drop the default `parameters` cell when papermill injected its own after it: the page shows the
    values that ran, once."""
    tags = [set(c.metadata.get("tags", [])) for c in nb.cells]
    if any("injected-parameters" in t for t in tags):
        nb.cells = [c for c, t in zip(nb.cells, tags) if "parameters" not in t]
    return nb


def title(nb) -> str:
    """The notebook's title: its first Markdown heading ("01 · Run the trials"), else "Notebook"."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#{1,6}\s+(.+?)\s*#*\s*$", cell.source, re.M)
            if m:
                return m.group(1)
    return "Notebook"


def export_html(nb_path) -> Path:
    """nb_path with .html: the executed notebook as one offline page titled as the notebook, its styles
    pruned to the rules the page can use (pruned_styles), through report.write_new."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    from pdlib.report.io import write_new

    nb_path = Path(nb_path)
    exporter = HTMLExporter(
        extra_loaders=[DictLoader({"pdlib_offline.html.j2": OFFLINE_TEMPLATE})], template_file="pdlib_offline.html.j2"
    )
    nb = one_parameters_cell(nbformat.read(nb_path, as_version=4))
    nb.metadata["title"] = title(nb)  # the page's <title>; nbconvert's default is "Notebook"
    body, _ = exporter.from_notebook_node(nb)
    return write_new(nb_path.with_suffix(".html"), pruned_styles(body), what="page")


# ---- styles: JupyterLab's stylesheet is ~250 kB, mostly rules for widgets and icons no page here has ------
STYLE = re.compile(r"(<style[^>]*>)(.*?)(</style>)", re.S)
_OPAQUE = re.compile(r":(?:not|is|where|has)\((?:[^()]|\([^()]*\))*\)|\[[^\]]*\]")  # may match without a class
_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")


def _blocks(css: str):
    """Top-level (prelude, body) pairs of a stylesheet, braces matched, comments removed."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    i = 0
    while (j := css.find("{", i)) >= 0:
        depth, k = 1, j + 1
        while depth and k < len(css):
            depth += {"{": 1, "}": -1}.get(css[k], 0)
            k += 1
        yield css[i:j].strip(), css[j + 1 : k - 1]
        i = k


def _declarations(body: str) -> list[str]:
    """A rule's declarations, split at semicolons outside quotes and parentheses (data: URLs hold both)."""
    out, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(body):
        if quote:
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == ";" and depth == 0:
            out.append(body[start:i].strip())
            start = i + 1
    return [d for d in [*out, body[start:].strip()] if d]


def _rules(css: str, classes: set) -> list:
    """(prelude, body) of the rules that can match a page whose elements carry `classes`: a selector is dropped
    when it names a class no element has (outside :not() and the like); @media recursed, other @-rules kept."""
    kept = []
    for prelude, body in _blocks(css):
        if prelude.startswith(("@media", "@supports")):
            inner = _rules(body, classes)
            if inner:
                kept.append((prelude, inner))
        elif prelude.startswith("@"):
            kept.append((prelude, body))
        else:
            selectors = [
                sel.strip() for sel in prelude.split(",") if set(_CLASS.findall(_OPAQUE.sub("", sel))) <= classes
            ]
            if selectors:
                kept.append((",".join(selectors), body))
    return kept


def _text(rules, used: set) -> str:
    """The rules as CSS, leaving out custom properties (--x: ...) nothing in `used` reads."""
    out = []
    for prelude, body in rules:
        if isinstance(body, list):
            out.append(f"{prelude}{{{_text(body, used)}}}")
            continue
        decls = [d for d in _declarations(body) if not d.startswith("--") or d.split(":", 1)[0].strip() in used]
        if decls or prelude.startswith("@"):
            out.append(f"{prelude}{{{';'.join(decls) if not prelude.startswith('@') else body.strip()}}}")
    return "\n".join(out)


def pruned_styles(page: str) -> str:
    """The page with each <style> reduced to the rules that can match its elements and the custom properties
    those (or the page's inline styles) read, transitively. The page has no scripts, so no element gains a
    class later; what is dropped can never apply."""
    classes = {c for attr in re.findall(r"""class=["']([^"']*)["']""", page) for c in attr.split()}
    sheets = [(m, _rules(m.group(2), classes)) for m in STYLE.finditer(page)]
    rest = STYLE.sub("", page)
    used, text = set(), rest + "".join(_text(r, set()) for _, r in sheets)  # every var() outside definitions
    definitions = {}
    for _, rules in sheets:
        for _prelude, body in _flat(rules):
            for d in _declarations(body):
                if d.startswith("--"):
                    name, _, value = d.partition(":")
                    definitions.setdefault(name.strip(), []).append(value)
    todo = set(re.findall(r"var\(\s*(--[\w-]+)", text))
    while todo:
        name = todo.pop()
        if name not in used:
            used.add(name)
            for value in definitions.get(name, []):
                todo |= set(re.findall(r"var\(\s*(--[\w-]+)", value)) - used
    out, last = [], 0
    for m, rules in sheets:
        out += [page[last : m.start()], m.group(1), "\n", _text(rules, used), "\n", m.group(3)]
        last = m.end()
    return "".join(out) + page[last:]


def _flat(rules):
    for prelude, body in rules:
        if isinstance(body, list):
            yield from _flat(body)
        elif not prelude.startswith("@"):
            yield prelude, body
