"""A chart as one PNG, rendered by vl-convert and stored losslessly in a fifth of the bytes.

    data = png.render(chart)          # 2x pixels (sharp on high-density screens), shown at the chart's size
    width, height = png.size(data)    # in pixels

vl-convert writes RGBA with the Sub filter at a fast zlib level; a chart is opaque and mostly flat colour, so
the same pixels as RGB (or as a palette when they use at most 256 colours), unfiltered, at zlib level 9, are
5-7x smaller. Same pixels: `decode(compact(p)) == decode(p)` wherever p is opaque (a test checks it).
"""

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCALE = 2


def render(chart, *, scale: int = SCALE) -> bytes:
    """An Altair chart (or its Vega-Lite dict) as a compact PNG."""
    import vl_convert as vlc

    spec = chart if isinstance(chart, dict) else chart.to_dict()
    return compact(vlc.vegalite_to_png(spec, scale=scale))


def size(data: bytes) -> tuple[int, int]:
    return struct.unpack(">II", data[16:24])


def _chunks(data: bytes):
    i = len(SIGNATURE)
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        yield data[i + 4 : i + 8], data[i + 8 : i + 8 + n]
        i += 12 + n


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _unfilter(raw: np.ndarray, bpp: int) -> np.ndarray:
    """PNG scanlines (filter byte first) to pixels' bytes."""
    out = np.zeros((raw.shape[0], raw.shape[1] - 1), np.uint8)
    prior = np.zeros(out.shape[1], np.int32)
    for r, row in enumerate(raw):
        kind, x = row[0], row[1:].astype(np.int32)
        if kind == 1:  # Sub: a running sum per channel
            x = np.cumsum(x.reshape(-1, bpp), axis=0).reshape(-1)
        elif kind == 2:  # Up
            x = x + prior
        elif kind in (3, 4):  # Average, Paeth: each byte needs the one decoded before it
            for i in range(x.size):
                a = x[i - bpp] if i >= bpp else 0
                b, c = prior[i], prior[i - bpp] if i >= bpp else 0
                if kind == 3:
                    x[i] = (x[i] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    x[i] = (x[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        x &= 255
        out[r], prior = x, x
    return out


def decode(data: bytes) -> np.ndarray:
    """An 8-bit, non-interlaced RGB, RGBA or palette PNG as an (h, w, 4) RGBA array."""
    chunks = list(_chunks(data))
    w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if depth != 8 or interlace or color not in (2, 3, 6):
        raise ValueError(f"unsupported PNG (bit depth {depth}, colour type {color}, interlace {interlace})")
    bpp = {2: 3, 3: 1, 6: 4}[color]
    raw = np.frombuffer(zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT")), np.uint8)
    px = _unfilter(raw.reshape(h, w * bpp + 1), bpp).reshape(h, w, bpp)
    if color == 3:
        palette = np.frombuffer(next(b for k, b in chunks if k == b"PLTE"), np.uint8).reshape(-1, 3)
        px = palette[px[..., 0]]
    if px.shape[2] == 3:
        px = np.concatenate([px, np.full((h, w, 1), 255, np.uint8)], axis=2)
    return px


def compact(data: bytes) -> bytes:
    """The same pixels, smaller: RGB (or a palette of at most 256 colours) when every pixel is opaque,
    unfiltered, zlib level 9. A PNG with transparency, or of a kind decode() does not read, is kept as it is."""
    try:
        rgba = decode(data)
    except ValueError:
        return data
    if (rgba[..., 3] != 255).any():
        return data
    h, w, _ = rgba.shape
    rgb = rgba[..., :3]
    key = (rgb[..., 0].astype(np.uint32) << 16) | (rgb[..., 1].astype(np.uint32) << 8) | rgb[..., 2]
    colours, index = np.unique(key.reshape(-1), return_inverse=True)
    if colours.size <= 256:
        color, rows = 3, index.reshape(h, w).astype(np.uint8)
        palette = np.stack([colours >> 16, (colours >> 8) & 255, colours & 255], axis=1).astype(np.uint8)
        extra = _chunk(b"PLTE", palette.tobytes())
    else:
        color, rows, extra = 2, rgb.reshape(h, w * 3), b""
    scanlines = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1)  # filter 0 on every row
    out = (
        SIGNATURE
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
        + extra
        + _chunk(b"IDAT", zlib.compress(scanlines.tobytes(), 9))
        + _chunk(b"IEND", b"")
    )
    return out if len(out) < len(data) else data
