"""Every PDLIB_* environment switch the project reads, in one table: its name, what it accepts, its default and
what it does. Values are read when asked for, never cached at import (tests set them with monkeypatch.setenv);
a bad value is an InputError naming the switch, the value and what it accepts.

    from pdlib import settings
    settings.get("PDLIB_PREFILL_GEMM")     # "bf16x3" when unset or empty
    settings.decode_mode()                 # PDLIB_DECODE, None when unset (the engine picks)
    settings.current()                     # {name: effective value} of every switch, for a report
"""

import os
from dataclasses import dataclass

from pdlib.errors import InputError


@dataclass(frozen=True)
class Switch:
    name: str
    accepts: tuple  # the accepted strings, and/or a type a value is read as (int, float: > 0; str: any)
    default: object  # the value when unset or empty
    doc: str


SWITCHES = {
    s.name: s
    for s in (
        # the engine's
        Switch(
            "PDLIB_DECODE",
            ("kernels", "persistent"),
            None,
            "decode path: six kernels a layer in one graph, or one persistent launch a token; unset: persistent "
            "where it runs (CUDA), else kernels",
        ),
        Switch(
            "PDLIB_PAIR_DECODE",
            ("pair", "each"),
            "pair",
            "a step's two decodes in one persistent launch, or one launch each",
        ),
        Switch(
            "PDLIB_DECODE_ROUND",
            ("each", "step", "compiled"),
            "each",
            "a step of three or more decodes: one decode launch each, or one ragged engine step (the weights "
            "read once for all rows, attention per row), or that step as one compiled function (a GPU)",
        ),
        Switch(
            "PDLIB_ROUND_PAIRS",
            (int,),
            2,
            "the largest decode round run as persistent pair launches (an odd row alone) where pairs run; larger "
            "rounds as PDLIB_DECODE_ROUND says (2: only a round of two)",
        ),
        Switch(
            "PDLIB_ROUND_GROUP",
            (int,),
            2,
            "the most decodes of such a round (PDLIB_ROUND_PAIRS) in one persistent launch: 2, pairs; up to 8 where "
            "their staged vectors fit beside attention's ring (Qwen3-0.6B: 8)",
        ),
        Switch(
            "PDLIB_ROUND_GEMM",
            ("mlx", "tiles16"),
            "mlx",
            "a step's matmuls of few rows (a decode round's): MLX's FP32 matmul below 16 rows and 64-row tensor-core "
            "tiles from there, or 16-row bf16x3 tiles on the bf16 copies up to 32 rows",
        ),
        Switch("PDLIB_PERSISTENT_FOLD", ("0", "1"), "0", "1: o_proj folded into the persistent kernel's attention"),
        Switch("PDLIB_PERSISTENT_BLOCKS", (int,), None, "the persistent kernel's blocks; unset: the SM count"),
        Switch(
            "PDLIB_PERSISTENT_LOAD",
            ("early", "late"),
            "early",
            "where the persistent kernel's weight phases request their first weights: before the barrier (early)"
            " or after staging their vectors (late)",
        ),
        Switch(
            "PDLIB_PREFILL_GEMM",
            ("bf16x3", "tf32x2", "tf32x3", "fp32", "wgmma"),
            "bf16x3",
            "the prefill's matmuls: kernels/gemm.py's kernels, or MLX's FP32 matmul (fp32)",
        ),
        Switch(
            "PDLIB_PREFILL_GEMM_SUM",
            ("fused-norm", "fused", "ops"),
            "fused-norm",
            "how a K split's parts are summed and the layer's epilogue applied",
        ),
        Switch("PDLIB_PREFILL_QK", ("kernel", "ops"), "kernel", "a prompt chunk's q/k norm, RoPE and K/V store"),
        Switch(
            "PDLIB_PREFILL_ATTENTION",
            ("flash-tf32x3", "flash", "ops"),
            "flash-tf32x3",
            "prefill attention: the flash kernel on tensor cores, in FP32, or MLX's ops",
        ),
        Switch(
            "PDLIB_STEP_DISPATCH",
            ("layers", "step"),
            "layers",
            "a step with a prompt chunk started layer by layer, or as one graph",
        ),
        Switch(
            "PDLIB_TOKEN_READ",
            ("item", "mailbox"),
            None,
            "how the host reads a decode's token; unset: mailbox where the persistent kernel decodes, else item",
        ),
        Switch(
            "PDLIB_PARTITION_SMS",
            (int,),
            48,
            "the partition policy's SMs for A's decodes while B's prompt runs on the rest (CUDA; rounded up to "
            "a multiple of 8)",
        ),
        # the runners' and tools'
        Switch(
            "PDLIB_KV_CACHE_GIB",
            (float,),
            16.0,
            "GiB a serving run's caches may take in all: as many as fit, N at most, each holding the workload's "
            "longest prompt + output; a request waits for a free one (an H200 holds ~100 GiB of them beside the "
            "model, an H100 ~64)",
        ),
        Switch("PDLIB_OVERLAP_TIMEOUT_S", (float,), 600.0, "seconds the overlap runner waits for a prefill"),
        Switch("PDLIB_DISAGG_TRANSFER", ("whole", "layers"), "whole", "the K/V transfer's collective shape"),
        Switch("PDLIB_DISAGG_PREFILL_CHUNK", ("whole", int), "whole", "the prefill worker's chunk in tokens"),
        Switch(
            "PDLIB_DISAGG_TIMEOUT_S",
            (float,),
            None,
            "seconds a disaggregated prefill and transfer may take; unset: 20x the worker's own prefill of B at "
            "setup (at least 30 s) and 120 s",
        ),
        Switch("PDLIB_DISAGG_WORKER_LOG", (str,), None, "a path that keeps the prefill worker's stderr"),
        Switch("PDLIB_DISAGG_WORKER_FAULT", (str,), None, "test hook: exit@N makes the N-th prefill command exit 1"),
        Switch("PDLIB_PREFILL_GPU", (str,), None, "CUDA_VISIBLE_DEVICES of the prefill worker; unset: the second GPU"),
        Switch("PDLIB_LOCAL_OUTPUTS", (str,), None, "where local runs are written; unset: outputs/local"),
    )
}

ENGINE = tuple(
    name
    for name in SWITCHES
    if name
    in (
        "PDLIB_DECODE",
        "PDLIB_PAIR_DECODE",
        "PDLIB_DECODE_ROUND",
        "PDLIB_ROUND_PAIRS",
        "PDLIB_ROUND_GROUP",
        "PDLIB_ROUND_GEMM",
        "PDLIB_PERSISTENT_FOLD",
        "PDLIB_PERSISTENT_BLOCKS",
        "PDLIB_PERSISTENT_LOAD",
        "PDLIB_PREFILL_GEMM",
        "PDLIB_PREFILL_GEMM_SUM",
        "PDLIB_PREFILL_QK",
        "PDLIB_PREFILL_ATTENTION",
        "PDLIB_STEP_DISPATCH",
        "PDLIB_TOKEN_READ",
        "PDLIB_PARTITION_SMS",
        "PDLIB_KV_CACHE_GIB",
    )
)  # those that change what the engine computes or how it is timed (the caches' memory: how many requests run)

_TYPES = {int: "a whole number >= 1", float: "a number > 0", str: "any text"}
_LIMITS = {int: 2_147_483_647, float: 10**15}  # far past any use; a 20-digit block count or inf GiB is a typo


def _accepted(s: Switch) -> str:
    return " or ".join(_TYPES[a] if isinstance(a, type) else a for a in s.accepts)


def parse(name: str, value: str):
    """`value` as switch `name` reads it; one it does not accept raises InputError."""
    s = SWITCHES[name]
    if value in s.accepts:
        return value
    for kind in (a for a in s.accepts if isinstance(a, type)):
        try:
            v = kind(value)
        except ValueError:
            continue
        if kind is str or 0 < v <= _LIMITS[kind]:  # nan fails both
            return v
        if v > _LIMITS[kind]:
            raise InputError(f"{name} must be {_accepted(s)}, at most {_LIMITS[kind]}, got {value!r}")
    raise InputError(f"{name} must be {_accepted(s)}, got {value!r}")


def get(name: str):
    """Switch `name`'s effective value: its default when unset or empty, else the environment's, parsed."""
    value = os.environ.get(name)
    return parse(name, value) if value else SWITCHES[name].default


def decode_mode(mode: str | None = None) -> str | None:
    """The decode path asked for, `mode` or PDLIB_DECODE; None when neither says (the engine then takes
    persistent where it runs and kernels elsewhere)."""
    return parse("PDLIB_DECODE", mode) if mode else get("PDLIB_DECODE")


def current(names=None) -> dict:
    """{name: effective value} of every switch (or of `names`), for a report to record."""
    return {name: get(name) for name in (names or SWITCHES)}
