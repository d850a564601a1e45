"""What a rendered or published folder keeps of its charts: each stored once, as its PNG file, which the notebooks
and pages refer to (with alt text); only a PNG no file of the folder holds is inline."""

import base64
import hashlib
import re
from pathlib import Path

import nbformat

from pdlib.publish.charts import REFERENCE

IMG = re.compile(r"<img\b[^>]*>")


def attr(tag: str, name: str) -> str | None:
    m = re.search(rf'\b{name}="([^"]*)"', tag)
    return m.group(1) if m else None


def assert_each_chart_once(folder: Path) -> dict:
    """No .png file of `folder` has its bytes, base64 or decoded, in a notebook or page there; every <img> names
    a file of the folder or holds an image no file has, with alt text. Returns {"references", "inline"}: how many
    <img> of each kind the pages show."""
    files = {hashlib.sha256(p.read_bytes()).digest(): p.name for p in folder.glob("*.png")}
    b64 = {name: base64.b64encode((folder / name).read_bytes()).decode() for name in files.values()}
    seen = {"references": 0, "inline": 0}
    for path in sorted([*folder.glob("*.ipynb"), *folder.glob("*.html")]):
        text = path.read_text()
        for name, data in b64.items():
            assert data not in text, f"{path.name}: {name} stored again (base64)"
        tags = IMG.findall(text)
        if path.suffix == ".ipynb":
            nb = nbformat.reads(text, as_version=4)
            outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
            tags = []
            for o in outputs:
                data = o.get("data", {})
                if "image/png" in data:
                    name = files.get(hashlib.sha256(base64.b64decode(data["image/png"])).digest())
                    assert name is None, f"{path.name}: {name} stored again (an image/png output)"
                    assert o["metadata"]["image/png"]["alt"], f"{path.name}: an inline PNG without alt text"
                ref = o.get("metadata", {}).get("text/html", {}).get(REFERENCE)
                if ref is not None:
                    (tag,) = IMG.findall(data["text/html"])
                    assert attr(tag, "src") == ref, tag[:200]
                    tags.append(tag)
        for tag in tags:
            src, alt = attr(tag, "src"), attr(tag, "alt")
            assert alt, f"{path.name}: an image without alt text: {tag[:200]}"
            if src.startswith("data:"):
                assert src.startswith("data:image/png;base64,"), tag[:200]
                digest = hashlib.sha256(base64.b64decode(src.split(",", 1)[1])).digest()
                assert digest not in files, f"{path.name}: {files[digest]} inline"
                seen["inline"] += path.suffix == ".html"
            else:
                assert src in files.values(), f"{path.name}: refers to {src}, which the folder does not hold"
                seen["references"] += path.suffix == ".html"
    return seen
