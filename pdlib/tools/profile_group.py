"""Where a persistent decode launch's time goes, request count by request count: the kernel's own stamps (its
build with STAMPS on: block 0's clock at each phase's start and end), read back per phase and per layer.

    result = profile_groups(model, requests=(1, 2, 4, 8), context=2048, steps=20)

Each launch decodes n requests at `context` positions (n = 1: the single kernel, 2: the pair's, 3 to 8 a
group's) on caches of the model's shape filled with noise; the stamps of `steps` launches after `warmup`
give, per phase, the median over launches of its mean per layer: a layer's five phases (q|k|v, attention,
o_proj, gate|up, down), each followed by the grid barrier block 0 waits at, the four weight phases' staging of
their vectors (within them: the vectors in shared memory, RMSNormed where the phase norms them), then the LM head
once. SM cycles are
turned into microseconds by the launch's own ratio of globaltimer to clock over the whole launch, so each
phase's figure keeps the clock's resolution. Timing a launch with stamps adds its stores to block 0's path
only.
"""

import statistics

import mlx.core as mx
import numpy as np

from pdlib.engine.kernels import new_fence
from pdlib.engine.kernels import persistent_decode as P
from pdlib.engine.model import Qwen3
from pdlib.weights import LoadedModel

# a layer's marks (P.STAMPS_PER_LAYER): q|k|v's start, its vectors staged, its end; attention's start and end; o_proj's
# start, staged, end; gate|up's; down's. Each phase from its start to its end (its staging included), then the barrier
# after it; "<phase> staging": its start to its vectors staged (RMSNormed where the phase norms them).
SPANS = (
    ("q|k|v", 0, 2),
    ("barrier 1", 2, 3),
    ("attention", 3, 4),
    ("barrier 2", 4, 5),
    ("o_proj", 5, 7),
    ("barrier 3", 7, 8),
    ("gate|up", 8, 10),
    ("barrier 4", 10, 11),
    ("down", 11, 13),
)
STAGING = (("q|k|v staging", 0, 1), ("o_proj staging", 5, 6), ("gate|up staging", 8, 9), ("down staging", 11, 12))
PHASES = tuple(name for name, _, _ in SPANS)
LAST = "barrier 5"  # after down: the wait before the next layer (the last layer's, before the LM head)


def phase_us(stamps, layers: int) -> dict:
    """One launch's stamps (STAMPS_PER_LAYER a layer, the LM head's start and end, the kernel's start: globaltimer
    ns, then the same as SM cycles) -> {phase: µs per layer (mean over layers)}, each staging too, with "LM head",
    "prologue" (the kernel's start to layer 0's first mark) and "launch" (the kernel's start to the LM head's end)."""
    m = P.STAMPS_PER_LAYER
    s = np.asarray(stamps, dtype=np.int64)
    n = m * layers + 3
    if s.shape != (2 * n,):
        raise ValueError(f"stamps of {layers} layers hold {2 * n} words, got shape {s.shape}")
    ns, cyc = s[:n], s[n:]
    if not (np.all(np.diff(cyc[: m * layers + 2]) >= 0) and cyc[n - 1] <= cyc[0]):
        raise ValueError("stamps out of order: a phase ends before it starts (block 0's clock)")
    us_per_cycle = (ns[m * layers + 1] - ns[n - 1]) / 1e3 / max(int(cyc[m * layers + 1] - cyc[n - 1]), 1)
    per = cyc[: m * layers].reshape(layers, m)
    ends = np.append(per[1:, 0], cyc[m * layers])  # where each layer's last barrier ends
    out = {name: float(np.mean(per[:, b] - per[:, a])) * us_per_cycle for name, a, b in SPANS + STAGING}
    out[LAST] = float(np.mean(ends - per[:, m - 1])) * us_per_cycle
    out["LM head"] = float(cyc[m * layers + 1] - cyc[m * layers]) * us_per_cycle
    out["prologue"] = float(cyc[0] - cyc[n - 1]) * us_per_cycle
    out["launch"] = float(ns[m * layers + 1] - ns[n - 1]) / 1e3
    return out


def medians(launches: list[dict]) -> dict:
    """Each phase's median over launches."""
    return {k: statistics.median(d[k] for d in launches) for k in launches[0]}


def profile_groups(model: LoadedModel, *, requests, context: int, steps: int, warmup: int = 3) -> dict:
    """{"context", "layers", "groups": {n: {phase: µs}}} (module docstring). Every launch decodes the same
    step again (the caches' slot at `context` rewritten), so each is alike."""
    cfg = model.config
    dw = Qwen3(model, decode="persistent", token_read="item", compile_steps=False).decode_weights  # bf16, stacked
    L, Hkv, Dh = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    kw = dict(heads=cfg.num_attention_heads, kv_heads=Hkv, eps=cfg.rms_norm_eps, stamps=True)
    out = {}
    for n in requests:
        reqs = []
        for q in range(n):
            k, v = (mx.random.normal((L, Hkv, context + 8, Dh)) * 0.5 for _ in range(2))
            token = mx.array((q * 7919 + 11) % cfg.vocab_size, mx.uint32)
            reqs.append((token, mx.array([context], mx.int32), k, v, new_fence()))
        sync = P.new_sync()
        mx.eval(reqs, sync)
        launches = []
        for i in range(warmup + steps):
            token, pos, k, v, fence = reqs[0]
            outs = P.launch(token, pos, dw, k, v, fence, sync, others=tuple(reqs[1:]), **kw)
            mx.eval(outs)
            P.check_token(int(outs[1][0].item()))
            reqs = [(t, p, k, v, f) for (t, p, k, v, _), f in zip(reqs, outs[5:], strict=True)]
            if i >= warmup:
                launches.append(phase_us(np.array(outs[4]), L))
        out[n] = medians(launches)
    return {"context": context, "layers": L, "groups": out}


def format_groups(result: dict) -> str:
    """A row per phase (µs per layer; the LM head, prologue and launch once), a column per request count, and
    each column's growth over the first."""
    groups = result["groups"]
    ns = list(groups)
    names = [*PHASES, LAST, *(name for name, _, _ in STAGING), "LM head", "prologue", "launch"]
    lines = [f"{'phase (µs)':16s} " + " ".join(f"{f'{n} req':>9s}" for n in ns)]
    for name in names:
        lines.append(f"{name:16s} " + " ".join(f"{groups[n][name]:9.2f}" for n in ns))
    first = groups[ns[0]]["launch"]
    lines.append(f"{f'launch / {ns[0]} req':16s} " + " ".join(f"{groups[n]['launch'] / first:9.2f}" for n in ns))
    return "\n".join(lines)
