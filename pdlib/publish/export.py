"""An executed notebook as one offline HTML page: no CDN scripts, images inline with alt text, and one
parameters cell (papermill's injected one, which the orchestrator fills with every parameter).

    html = export_html("outputs/local/run/02_analyze_gaps.ipynb")   # -> .html beside it; never overwrites
"""

from pathlib import Path

# JupyterLab's page without its CDN scripts (require.js, MathJax, mermaid): the notebooks use none of
# them, and without them the page loads nothing from the network. PNGs carry the alt text the cell gave
# (nbconvert's own template has none).
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
"""


def one_parameters_cell(nb):
    """Drop the default `parameters` cell when papermill injected its own after it: the page shows the
    values that ran, once."""
    tags = [set(c.metadata.get("tags", [])) for c in nb.cells]
    if any("injected-parameters" in t for t in tags):
        nb.cells = [c for c, t in zip(nb.cells, tags) if "parameters" not in t]
    return nb


def export_html(nb_path) -> Path:
    """nb_path with .html: the executed notebook as one offline page, through report.write_new."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    from pdlib.report.io import write_new
    nb_path = Path(nb_path)
    exporter = HTMLExporter(extra_loaders=[DictLoader({"pdlib_offline.html.j2": OFFLINE_TEMPLATE})],
                            template_file="pdlib_offline.html.j2")
    nb = one_parameters_cell(nbformat.read(nb_path, as_version=4))
    body, _ = exporter.from_notebook_node(nb)
    return write_new(nb_path.with_suffix(".html"), body, what="page")
