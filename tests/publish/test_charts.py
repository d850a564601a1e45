"""Each chart stored once: an inline PNG whose bytes equal a .png file of the folder becomes a reference to that file
(charts.refer_to_files), in the notebook and in its page; one no file holds, even by one byte, stays inline."""

import base64
import re
import struct
import zlib

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from publish.folders import IMG, assert_each_chart_once, attr  # tests/ is on sys.path (conftest.py)

from pdlib.publish.charts import REFERENCE, refer_to_files
from pdlib.publish.export import OFFLINE_TEMPLATE, export_html

ALT = {"saved": "A saved chart: one bar per policy, eager tallest", "drawn": "A chart no file holds: one dot"}


def png(rgb: tuple, width: int = 3, height: int = 2) -> bytes:
    """A small RGB PNG of one colour."""

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def chart_output(data: bytes, alt: str):
    """An output as present.show_chart leaves it in a published notebook: the PNG with its size and alt text."""
    return new_output(
        "display_data",
        data={"image/png": base64.b64encode(data).decode(), "text/plain": f"<chart: {alt}>"},
        metadata={"image/png": {"width": 300, "height": 200, "alt": alt}},
    )


def notebook(saved: bytes, drawn: bytes):
    """A notebook with one cell showing two charts, the first `saved` (in the folder as saved.png), the second not;
    and a table (text/html), which no chart reference may touch."""
    table = new_output("display_data", data={"text/html": "<table><tr><td>1</td></tr></table>", "text/plain": "1"})
    cell = new_code_cell("show()", outputs=[chart_output(saved, ALT["saved"]), chart_output(drawn, ALT["drawn"])])
    cell.outputs.append(table)
    return new_notebook(cells=[new_markdown_cell("# 09 · Charts"), cell])


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "saved.png").write_bytes(png((200, 30, 30)))
    return tmp_path


def test_a_png_equal_to_a_file_becomes_a_reference_with_its_alt_text_and_one_no_file_holds_stays_inline(folder):
    saved, drawn = png((200, 30, 30)), png((30, 30, 200))
    nb = notebook(saved, drawn)
    assert refer_to_files(nb, folder) == 1
    first, second, table = nb.cells[1].outputs
    assert set(first["data"]) == {"text/html", "text/plain"} and "saved.png" in first["data"]["text/plain"]
    assert first["metadata"] == {"text/html": {REFERENCE: "saved.png"}}
    (tag,) = IMG.findall(first["data"]["text/html"])
    assert (attr(tag, "src"), attr(tag, "alt")) == ("saved.png", ALT["saved"])
    assert (attr(tag, "width"), attr(tag, "height")) == ("300", "200")  # the size the PNG was shown at
    assert second == chart_output(drawn, ALT["drawn"])  # nothing lost: the PNG no file holds, as it was
    assert table["data"]["text/html"].startswith("<table>")
    assert refer_to_files(nb, folder) == 0  # a reference is not a PNG: nothing left to replace
    nbformat.validate(nb)


def test_a_file_one_byte_off_is_no_match(folder):
    """Matched by the bytes, never by the name: a file that differs in one byte leaves the PNG inline."""
    saved = png((200, 30, 30))
    planted = bytearray(saved)
    planted[-1] ^= 1  # the last byte (the IEND chunk's CRC): named like the chart, not its bytes
    (folder / "saved.png").write_bytes(bytes(planted))
    nb = notebook(saved, png((30, 30, 200)))
    assert refer_to_files(nb, folder) == 0
    assert [set(o["data"]) for o in nb.cells[1].outputs[:2]] == [{"image/png", "text/plain"}] * 2


def test_the_page_shows_the_file_and_is_otherwise_the_page_of_the_inline_png(folder, tmp_path_factory):
    saved, drawn = png((200, 30, 30)), png((30, 30, 200))
    nb = notebook(saved, drawn)
    before = tmp_path_factory.mktemp("inline") / "09_charts.ipynb"  # the same notebook, its PNGs inline
    before.write_text(nbformat.writes(nb))
    refer_to_files(nb, folder)
    after = folder / "09_charts.ipynb"
    after.write_text(nbformat.writes(nb))
    page = export_html(after).read_text()
    imgs = IMG.findall(page)
    assert len(imgs) == 2 and base64.b64encode(saved).decode() not in page
    assert (attr(imgs[0], "src"), attr(imgs[0], "alt")) == ("saved.png", ALT["saved"])
    assert attr(imgs[1], "src") == "data:image/png;base64," + base64.b64encode(drawn).decode()
    assert not re.search(r"""(?:src|href)=["']?https?:""", page)  # offline: nothing from the network
    inline = export_html(before).read_text()
    assert page == inline.replace(f"data:image/png;base64,{base64.b64encode(saved).decode()}", "saved.png")
    assert assert_each_chart_once(folder) == {"references": 1, "inline": 1}
    assert f"get_metadata('{REFERENCE}', 'text/html')" in OFFLINE_TEMPLATE  # the key the template spells out


def test_the_check_of_a_folder_finds_a_chart_stored_twice(folder):
    """assert_each_chart_once (the rendered and published folders' check) fails on a page or a notebook that
    still holds a file's bytes."""
    (folder / "09_charts.ipynb").write_text(nbformat.writes(notebook(png((200, 30, 30)), png((30, 30, 200)))))
    with pytest.raises(AssertionError, match="saved.png stored again"):
        assert_each_chart_once(folder)


def test_refer_again_replaces_an_earlier_notebook_and_page_once_a_later_one_saved_the_file(tmp_path):
    """02 shows two charts 03 saves: stored before the files exist, it keeps them inline until the run's last
    notebook has run; refer_again then replaces its notebook and page (the page a fresh export of the notebook),
    leaves no hidden copy, and does nothing to a notebook with nothing left to refer to."""
    from pdlib.publish.notebooks import refer_again

    saved, drawn = png((200, 30, 30)), png((30, 30, 200))
    nb_path = tmp_path / "09_charts.ipynb"
    nb_path.write_text(nbformat.writes(notebook(saved, drawn)))
    export_html(nb_path)
    assert refer_again([nb_path]) == []  # no file yet: as stored
    (tmp_path / "saved.png").write_bytes(saved)  # a later notebook saves it
    assert refer_again([nb_path]) == [nb_path]
    assert assert_each_chart_once(tmp_path) == {"references": 1, "inline": 1}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "09_charts.ipynb").write_text(nb_path.read_text())
    assert nb_path.with_suffix(".html").read_text() == export_html(fresh / "09_charts.ipynb").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["09_charts.html", "09_charts.ipynb", "fresh", "saved.png"]
    assert refer_again([nb_path]) == []  # nothing left: neither file replaced again
