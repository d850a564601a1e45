"""Each chart stored once: in a published folder the chart's PNG file (plots.save_chart) is the one copy, and the
notebook and its page refer to it rather than carry its bytes again.

    refer_to_files(nb, folder)   # each inline PNG equal to a .png in folder -> <img src="name.png" alt=...>

A reference is an output of `text/html` (the <img>, with the alt text and size the PNG output had), `text/plain`
(a line naming the file) and metadata {"text/html": {REFERENCE: "name.png"}}: JupyterLab shows the <img> from the
folder, and export.py's page draws it as it drew the inline PNG, with the file as its source (offline, as a
folder).
"""

import base64
import hashlib
import html
from pathlib import Path
from urllib.parse import quote

REFERENCE = "pdlib_chart_file"  # output metadata["text/html"] key: the PNG file a reference shows


def reference(name: str, meta: dict) -> dict:
    """The output data showing the PNG file `name` with the alt text and size of the PNG output's `meta`."""
    attrs = [("src", quote(name))] + [(k, meta[k]) for k in ("width", "height") if meta.get(k) is not None]
    attrs.append(("alt", meta.get("alt") or "chart"))
    img = "<img " + " ".join(f'{k}="{html.escape(str(v))}"' for k, v in attrs) + ">"
    return {"text/html": img, "text/plain": f"<chart: {name}>"}


def refer_to_files(nb, folder) -> int:
    """Replace each image/png output whose bytes equal a .png file in `folder` (by SHA-256, never by name) with a
    reference to that file, so the folder stores the chart once. A PNG with no equal file stays inline: nothing
    is lost; nor is an output that also holds text/html touched. Returns how many were replaced."""
    files = {}
    for path in sorted(Path(folder).glob("*.png")):
        files.setdefault(hashlib.sha256(path.read_bytes()).digest(), path.name)
    replaced = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data or "text/html" in data:
                continue
            name = files.get(hashlib.sha256(base64.b64decode(data["image/png"])).digest())
            if name is None:
                continue
            meta = output.get("metadata", {})
            png = meta.pop("image/png", {})
            del data["image/png"]
            data.pop("text/plain", None)
            data.update(reference(name, png))
            meta["text/html"] = {REFERENCE: name}
            output["metadata"] = meta
            replaced += 1
    return replaced
