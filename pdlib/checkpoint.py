"""Checkpoint files checked before anything is read onto a device: config.json, each *.safetensors file's header
against the file's size, and a sharded checkpoint's index.

    config = read_json_object(directory / "config.json")
    check_safetensors_files(directory, sorted(directory.glob("*.safetensors")))

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header (tensor name ->
{dtype, shape, data_offsets}, plus an optional __metadata__), then the data section; offsets count from its
start. MLX's loader trusts the header, so a truncated download would fail deep inside it (or read past the end).
"""

import json
import math
from pathlib import Path

from pdlib.errors import InputError

# The dtypes pdlib widens to FP32 exactly; an integer or FP8 tensor would be cast as raw numbers
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
LAYOUT = 'an object of tensor name: {"dtype", "shape", "data_offsets"}'
REFETCH = "re-download or re-save the checkpoint"
JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def read_json_object(path: Path) -> dict:
    """A JSON file whose top level is an object, or an InputError naming the file and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text ({e.reason}); expected a JSON object") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    if not text.strip():
        raise InputError(f"{path} is empty; expected a JSON object")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        cut = ", the file ends early: truncated?" if not text.rstrip().endswith(("}", "]")) else ""
        raise InputError(
            f"{path} is not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}{cut}); expected a JSON object"
        ) from None
    except RecursionError:
        raise InputError(f"{path} is not a usable JSON object: nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} holds a JSON {JSON_KINDS[type(data)]} {data!r:.60}; expected a JSON object")
    return data


def check_safetensors_files(directory: Path, files: list[Path]) -> None:
    """Every shard's header is whole and fits its file; every shard a sharded index names is present."""
    for index in sorted(directory.glob("*.safetensors.index.json")):
        check_index(index, {f.name for f in files})
    for f in files:
        safetensors_header(f)


def check_index(index: Path, present: set[str]) -> None:
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(
            f"{index}: weight_map must be an object of tensor name: shard file name, got {weight_map!r:.80}"
        )
    absent = sorted(set(weight_map.values()) - present)
    if absent:
        raise InputError(
            f"{index} names shard {absent[0]}, which is not in {index.parent}"
            f"{f' ({len(absent)} shards absent)' if len(absent) > 1 else ''}; an incomplete download? {REFETCH}"
        )


def safetensors_header(path: Path) -> dict[str, dict]:
    """The header's tensor entries (name -> {dtype, shape, data_offsets}), each checked against the file's size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            raw = f.read(n) if n is not None and n <= size - 8 else b""
    except OSError as e:
        raise InputError(f"cannot read checkpoint file {path}: {e.strerror or e}") from None
    if size == 0:
        raise InputError(f"checkpoint file {path} is empty (0 bytes); expected a safetensors file: {REFETCH}")
    if n is None:
        raise InputError(
            f"checkpoint file {path} is cut short ({size} bytes): a safetensors file starts with an 8-byte header "
            f"length; {REFETCH}"
        )
    if n > size - 8:
        raise InputError(
            f"checkpoint file {path} is cut inside its header: the header is {n} bytes but only {size - 8} follow "
            f"its length (a truncated file, or not safetensors); {REFETCH}"
        )
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise InputError(
            f"checkpoint file {path} has a header that is not JSON; expected {LAYOUT}; {REFETCH}"
        ) from None
    if not isinstance(header, dict):
        raise InputError(
            f"checkpoint file {path} has a JSON {JSON_KINDS[type(header)]} for a header; expected {LAYOUT}"
        )
    data_bytes = size - 8 - n
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, entry in tensors.items():
        check_entry(path, name, entry, data_bytes, size)
    return tensors


def check_entry(path: Path, name: str, entry, data_bytes: int, size: int) -> None:
    """One tensor's entry: a dtype pdlib reads, a shape of sizes, and offsets that span exactly its bytes and lie
    inside the data section."""
    ok = isinstance(entry, dict)
    shape, offsets = (entry.get("shape"), entry.get("data_offsets")) if ok else (None, None)
    ok = ok and isinstance(shape, list) and all(_count(s) for s in shape)
    ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
    if not ok:
        raise InputError(
            f"checkpoint file {path}: tensor {name} has the header entry {entry!r:.120}; expected "
            f'{{"dtype": str, "shape": [sizes >= 0], "data_offsets": [begin, end]}}'
        )
    dtype = entry.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise InputError(
            f"checkpoint file {path}: tensor {name} has dtype {dtype!r}; pdlib reads {', '.join(DTYPE_BYTES)} only"
        )
    begin, end = offsets
    need = DTYPE_BYTES[dtype] * math.prod(shape)
    if end - begin != need:
        raise InputError(
            f"checkpoint file {path}: tensor {name} is {dtype} {tuple(shape)} ({need} bytes) but its data_offsets "
            f"{offsets} span {end - begin}; {REFETCH}"
        )
    if end > data_bytes:
        raise InputError(
            f"checkpoint file {path} is truncated: tensor {name} needs bytes {begin}..{end} of the data section, "
            f"which holds {data_bytes} ({size} bytes in all); {REFETCH}"
        )


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
