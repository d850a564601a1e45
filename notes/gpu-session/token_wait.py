"""Which host wait gets a finished kernel's token soonest, and does the sleeping wait's wake-up explain the
~0.5 ms that an observed persistent decode step (launch, then `.item()` on its token: 1.89 ms at 4K context)
costs over the kernel's own pace (pipelined 1.33 ms)? One JSON object per line on stdout.

Hypothesis. MLX's `.item()` on a scheduled array waits in `cudaEventSynchronize` on an event made with
`cudaEventBlockingSync` (mlx/backend/cuda/event.cu, `CopyableCudaEvent`), so the thread sleeps and is woken by
the GPU's completion interrupt (through KVM on these microVMs); the wake-up may cost more the longer (and
deeper) the host slept. `mx.synchronize()` instead spins in `cudaStreamSynchronize`, then hands off through
MLX's worker thread (mlx/backend/cuda/device.cpp, `CommandEncoder::synchronize`).

A (with B). A synthetic `mx.fast.cuda_kernel`, SM count x 256 threads, each spinning T us on %globaltimer;
the last block to finish writes the token, and into a host-mapped pinned mailbox (cuMemHostAlloc) its end
time then, after __threadfence_system(), a sequence number. For T in 0..2000 us, two token shapes ("gather":
a (4,) output read as pdlib does, `tok[0].item()`; "direct": a (1,) output, `.item()`), and four waits
before `.item()`: none ("item"), `mx.synchronize()`, ctypes `cuCtxSynchronize()`, and "poll" (Python spins
on the mailbox's sequence). Cells interleave step by step. The poll steps give the host-to-globaltimer
offset (min of seen - kernel end, per T), hence kernel end -> token seen / `.item()` return for every wait.
D (--engine). The real engine's observed decode, three ways per token (item, mx.synchronize, cuCtxSynchronize),
alternating blocks of 20.

    python3 notes/gpu-session/token_wait.py [context] [--engine]
    env: TOKEN_WAIT_STEPS (timed steps per cell, default 60), TOKEN_WAIT_TS (e.g. "0,20,1340")

Output: a "head" line (versions, context flags: sched 0 = AUTO), per T one "B" line (offset, drift) and per
(T, token, wait) one "A" line: medians/p90 (us) of seen (launch return -> token seen: the mailbox for poll,
`.item()` return otherwise), seen_minus_T, end_to_seen / end_to_item (kernel end -> seen / `.item()` return),
launch_to_start, vol_cs (voluntary context switches of this thread per step, getrusage(RUSAGE_THREAD): the
counter /proc/self/status shows for the main thread) and every ctypes rc; then "D" lines; last, "summary".
Reading it:
- Confirms: for "item", end_to_item ~10-40 us at T 0-20 but ~150-400 us at T >= 1000, with ~1 vol_cs/step,
  while poll's end_to_seen stays ~1-5 us (and cuCtxSynchronize, spinning under AUTO, stays small, ~0 vol_cs).
  Then the fix is in the wait: a spinning call before `.item()` (cuCtxSynchronize, if its seen is near
  poll's; no kernel change), or, best, a mailbox the persistent kernel's last block writes (token, sequence) that
  the engine polls with a timeout falling back to `.item()`. "direct" vs "gather" prices returning the token
  as its own (1,) output instead of `tok[0]`.
- Refutes: end_to_item flat (< ~30 us) in T, or equal for all waits: the ~0.5 ms is before or inside the
  kernel (launch onto an idle GPU, host dispatch, a slower cold kernel): look at launch_to_start here and at
  persistent_profile.py's timeline, not at the wait.
- D: if a wait's total_ms beats item's by about the synthetic gap at T ~1340, adopt it in Engine.decode's
  caller; if not, the synthetic gap does not carry over to the real kernel.
Wall time: ~10-25 s without --engine (14 kernel instances to JIT, then ~3.5 s of steps); --engine adds the
engine's build and 4K prefill as persistent_profile.py does, plus ~310 tokens (~1 s).
"""

import hashlib
import json
import os
import random
import statistics
import sys
import time

STEPS = int(os.environ.get("TOKEN_WAIT_STEPS", "60"))
WARM = 5                                     # rounds discarded before the timed ones
TS_US = [int(t) for t in os.environ.get("TOKEN_WAIT_TS", "0,20,100,300,1000,1340,2000").split(",")]
THREADS = 256
WAITS = ("item", "mx.synchronize", "cuCtxSynchronize", "poll")
TOKENS = {"gather": 4, "direct": 1}          # token output length; gather reads tok[0] as pdlib does
POLL_TIMEOUT_NS = 100_000_000                # beyond T; then falls back to .item() and counts a timeout
BOX_WORDS = 8                                # mailbox (uint64): 0 seq, 1 end, 2 last block's spin end,
                                             # 3 block 0's start, 4 token

# Kernel body (MLX writes the signature: const uint32_t* x, uint32_t* tok; template ints as constexpr int).
# Addresses come as two non-negative ints (addr >> 31, addr & 0x7fffffff): MLX's template ints are 32-bit
# `int` and it puts their values into the kernel's name, where a minus sign would not compile.
KERNEL_SOURCE = r"""
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  t = t0;
  while (t - t0 < (unsigned long long)SPIN_NS) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned long long* box =
        (volatile unsigned long long*)(((unsigned long long)BOX_HI << 31) | (unsigned long long)BOX_LO);
    unsigned int* done = (unsigned int*)(((unsigned long long)CTR_HI << 31) | (unsigned long long)CTR_LO);
    if (blockIdx.x == 0) {
      box[3] = t0;
      __threadfence_system();
    } else {
      __threadfence();
    }
    // a counter that only grows: the launch's last arriver sees a multiple of the grid less one
    unsigned int arrived = atomicAdd(done, 1u);
    if (arrived % gridDim.x == gridDim.x - 1) {
      __threadfence();
      unsigned long long seq = box[0] + 1ull;
      unsigned int token = (unsigned int)(seq & 0x7fffffffull);
      for (int i = 0; i < TOK_N; ++i) {
        tok[i] = i == 0 ? token : 0u;
      }
      unsigned long long te;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(te));
      box[4] = token;
      box[1] = te;
      box[2] = t;
      __threadfence_system();
      box[0] = seq;
    }
  }
"""
# MLX caches compiled PTX on disk by kernel name alone (/tmp/mlx/<version>/ptx): the name carries the source's hash
KERNEL_NAME = "token_wait_" + hashlib.sha1(KERNEL_SOURCE.encode()).hexdigest()[:10]

RESULTS: dict = {}   # for the summary


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def fail(msg: str, code: int = 1) -> None:
    emit({"probe": "token_wait", "error": msg})
    sys.exit(code)


def stats(xs, key):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return {f"{key}_med": None, f"{key}_p90": None}
    return {f"{key}_med": round(statistics.median(xs), 1), f"{key}_p90": round(xs[int(0.9 * (len(xs) - 1))], 1)}


def csw():
    """(voluntary, involuntary) context switches of the calling thread."""
    import resource
    if hasattr(resource, "RUSAGE_THREAD"):
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return r.ru_nvcsw, r.ru_nivcsw
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
    return int(d["voluntary_ctxt_switches"]), int(d["nonvoluntary_ctxt_switches"])


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class Driver:
    """libcuda through ctypes; every call's return code is kept (rcs) and nonzero ones named."""

    def __init__(self):
        import ctypes as C
        self.C = C
        self.lib = C.CDLL("libcuda.so.1")
        L, P = self.lib, C.POINTER
        sig = {"cuInit": [C.c_uint], "cuDriverGetVersion": [P(C.c_int)], "cuDeviceGet": [P(C.c_int), C.c_int],
               "cuDeviceGetAttribute": [P(C.c_int), C.c_int, C.c_int], "cuCtxGetCurrent": [P(C.c_void_p)],
               "cuCtxSetCurrent": [C.c_void_p], "cuCtxGetFlags": [P(C.c_uint)], "cuCtxSynchronize": [],
               "cuDevicePrimaryCtxRetain": [P(C.c_void_p), C.c_int], "cuDevicePrimaryCtxRelease_v2": [C.c_int],
               "cuDevicePrimaryCtxGetState": [C.c_int, P(C.c_uint), P(C.c_int)],
               "cuMemHostAlloc": [P(C.c_void_p), C.c_size_t, C.c_uint],
               "cuMemHostGetDevicePointer_v2": [P(C.c_uint64), C.c_void_p, C.c_uint],
               "cuMemAlloc_v2": [P(C.c_uint64), C.c_size_t], "cuMemsetD32_v2": [C.c_uint64, C.c_uint, C.c_size_t],
               "cuMemFreeHost": [C.c_void_p], "cuMemFree_v2": [C.c_uint64],
               "cuGetErrorName": [C.c_int, P(C.c_char_p)]}
        for name, args in sig.items():
            fn = getattr(L, name)
            fn.argtypes, fn.restype = args, C.c_int
        self.sync = L.cuCtxSynchronize
        self.rcs: dict = {}

    def name(self, rc):
        s = self.C.c_char_p()
        return s.value.decode() if self.lib.cuGetErrorName(rc, self.C.byref(s)) == 0 and s.value else str(rc)

    def call(self, fn, *args):
        rc = getattr(self.lib, fn)(*args)
        self.rcs[fn] = rc if rc == 0 else f"{rc} {self.name(rc)}"
        return rc

    def must(self, fn, *args):
        if self.call(fn, *args) != 0:
            raise RuntimeError(f"{fn} returned {self.rcs[fn]}")


def setup_context(drv, dev):
    """Make sure the device's primary context (the one MLX's runtime uses) is current on this thread, so that
    cuCtxSynchronize waits on MLX's streams; report what was found."""
    C = drv.C
    cur, prim, flags, pflags, active = C.c_void_p(), C.c_void_p(), C.c_uint(), C.c_uint(), C.c_int()
    drv.must("cuCtxGetCurrent", C.byref(cur))
    drv.must("cuDevicePrimaryCtxRetain", C.byref(prim), dev)
    info = {"ctx_current_was_primary": cur.value is not None and cur.value == prim.value,
            "ctx_current_was_null": cur.value is None}
    if cur.value != prim.value:
        drv.must("cuCtxSetCurrent", prim)
    drv.must("cuCtxGetFlags", C.byref(flags))
    drv.must("cuDevicePrimaryCtxGetState", dev, C.byref(pflags), C.byref(active))
    drv.call("cuDevicePrimaryCtxRelease_v2", dev)   # MLX holds its own reference
    info.update({"ctx_flags": flags.value, "ctx_sched": flags.value & 7, "primary_flags": pflags.value,
                 "primary_active": active.value})
    return info


def split31(addr: int):
    hi, lo = addr >> 31, addr & 0x7FFFFFFF
    if hi >= 2**31:
        raise RuntimeError(f"address {addr:#x} does not fit two 31-bit template ints")
    return hi, lo


def experiment_a(mx, np, drv, nsm):
    """A + B: the synthetic sweep; one line per (T, token, wait), one offset line per T."""
    C = drv.C
    hp, dbox, dctr = C.c_void_p(), C.c_uint64(), C.c_uint64()
    drv.must("cuMemHostAlloc", C.byref(hp), BOX_WORDS * 8, 0x1 | 0x2)    # PORTABLE | DEVICEMAP, pinned
    drv.must("cuMemHostGetDevicePointer_v2", C.byref(dbox), hp, 0)
    drv.must("cuMemAlloc_v2", C.byref(dctr), 256)
    drv.must("cuMemsetD32_v2", dctr, 0, 64)
    drv.must("cuCtxSynchronize")          # the memset ran on the legacy stream, which MLX's streams ignore
    box = np.ctypeslib.as_array((C.c_uint64 * BOX_WORDS).from_address(hp.value))
    box[:] = 0
    bhi, blo = split31(dbox.value)
    chi, clo = split31(dctr.value)
    emit({"exp": "B", "mailbox_host": hex(hp.value), "mailbox_dev": hex(dbox.value), "counter_dev": hex(dctr.value),
          "rcs": dict(drv.rcs)})
    kern = mx.fast.cuda_kernel(name=KERNEL_NAME, input_names=["x"], output_names=["tok"], source=KERNEL_SOURCE)
    x = mx.zeros((64,), mx.uint32)
    mx.eval(x)
    sync = drv.sync
    perf = time.perf_counter_ns

    def step(T, token, wait):
        seq0 = int(box[0])
        v0, i0 = csw()
        t0 = perf()
        (tok,) = kern(inputs=[x], template=[("SPIN_NS", T * 1000), ("TOK_N", TOKENS[token]), ("BOX_HI", bhi),
                                            ("BOX_LO", blo), ("CTR_HI", chi), ("CTR_LO", clo)],
                      grid=(nsm * THREADS, 1, 1), threadgroup=(THREADS, 1, 1), output_shapes=[(TOKENS[token],)],
                      output_dtypes=[mx.uint32])
        t = tok[0] if token == "gather" else tok
        mx.async_eval(t)
        t1 = perf()
        rc, seen, timeout = 0, None, False
        if wait == "poll":
            deadline = t1 + T * 1000 + POLL_TIMEOUT_NS
            while box[0] == seq0:
                if perf() > deadline:
                    timeout = True
                    break
            seen = perf()
        elif wait == "mx.synchronize":
            mx.synchronize()
        elif wait == "cuCtxSynchronize":
            rc = sync()
        tw = perf()
        val = t.item()
        t2 = perf()
        t.item()
        t3 = perf()
        v1, i1 = csw()
        seq1 = int(box[0])
        ok = seq1 == seq0 + 1 and val == (seq1 & 0x7FFFFFFF) and int(box[4]) == val
        return {"t1": t1, "seen": seen if seen is not None and not timeout else t2, "t2": t2, "end": int(box[1]),
                "start": int(box[3]), "launch_us": (t1 - t0) / 1e3, "wait_call_us": (tw - t1) / 1e3,
                "item_us": (t2 - tw) / 1e3, "item_again_us": (t3 - t2) / 1e3, "vol": v1 - v0, "invol": i1 - i0,
                "rc": rc, "timeout": timeout, "ok": ok, "poll": wait == "poll" and not timeout}

    cells = [(tk, w) for tk in TOKENS for w in WAITS]
    first_off = None
    for T in TS_US:
        try:
            for tk in TOKENS:   # compile this T's kernels outside the timing
                step(T, tk, "item")
            import gc
            gc.collect()
            gc.disable()
            rows = {c: [] for c in cells}
            try:
                for r in range(WARM + STEPS):
                    order = cells[:]
                    random.Random(r).shuffle(order)
                    for c in order:
                        s = step(T, *c)
                        if r >= WARM:
                            rows[c].append(s)
            finally:
                gc.enable()
            polls = [s for c in cells for s in rows[c] if s["poll"] and s["ok"]]
            off = min(s["seen"] - s["end"] for s in polls) if polls else None
            if first_off is None and off is not None:
                first_off = off
            emit({"exp": "B", "T_us": T, "offset_ns": off, "poll_steps": len(polls),
                  "offset_drift_us": None if off is None else round((off - first_off) / 1e3, 2)})
            for (tk, w), ss in rows.items():
                d = lambda a, b: None if off is None else (a - (b + off)) / 1e3  # noqa: E731
                row = {"exp": "A", "T_us": T, "token": tk, "wait": w, "steps": len(ss),
                       **stats([(s["seen"] - s["t1"]) / 1e3 for s in ss], "seen_us"),
                       **stats([(s["seen"] - s["t1"]) / 1e3 - T for s in ss], "seen_minus_T_us"),
                       **stats([d(s["seen"], s["end"]) for s in ss], "end_to_seen_us"),
                       **stats([d(s["t2"], s["end"]) for s in ss], "end_to_item_us"),
                       **stats([None if off is None else -d(s["t1"], s["start"]) for s in ss],
                               "launch_to_start_us"),   # kernel start (block 0) after the launch returned
                       **stats([(s["end"] - s["start"]) / 1e3 for s in ss], "kernel_us"),
                       **stats([s["launch_us"] for s in ss], "launch_us"),
                       **stats([s["wait_call_us"] for s in ss], "wait_call_us"),
                       **stats([s["item_us"] for s in ss], "item_us"),
                       **stats([s["item_again_us"] for s in ss], "item_again_us"),
                       "vol_cs": round(sum(s["vol"] for s in ss) / max(len(ss), 1), 2),
                       "invol_cs": round(sum(s["invol"] for s in ss) / max(len(ss), 1), 2),
                       "bad_tokens": sum(not s["ok"] for s in ss), "timeouts": sum(s["timeout"] for s in ss),
                       "wait_rc_nonzero": sorted({drv.name(s["rc"]) for s in ss if s["rc"] != 0})}
                RESULTS[("A", T, tk, w)] = row
                emit(row)
        except Exception as e:  # keep the other T values
            emit({"exp": "A", "T_us": T, "error": f"{type(e).__name__}: {e}"})
    mx.synchronize()
    drv.call("cuMemFreeHost", hp)
    drv.call("cuMemFree_v2", dctr)
    emit({"exp": "A", "done": True, "rcs": dict(drv.rcs)})


def experiment_d(mx, drv, ctx_len):
    """D: the real engine's observed decode, built as persistent_profile.py does, three waits per token."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        import pdlib  # noqa: F401
    except ImportError:
        sys.path.insert(0, root)
    from pdlib.engine import Engine, check_token
    from pdlib.weights import load_model

    t_build = time.perf_counter()
    model = load_model("synthetic:qwen3-0.6b")
    engine = Engine(model, capacity=ctx_len + 1200, decode="persistent")
    engine.add_request("X", [(i * 7919 + 13) % 50000 for i in range(ctx_len)])
    engine.reset("X", logical=True)
    engine.prefill_chunk("X", ctx_len).token.item()
    for _ in range(10):   # compile and settle
        check_token(engine.decode("X").token.item())
    emit({"exp": "D", "context": ctx_len, "build_s": round(time.perf_counter() - t_build, 1),
          "decode": getattr(engine.model, "decode_mode", None)})
    sync, perf = drv.sync, time.perf_counter_ns
    modes = ("item", "mx.synchronize", "cuCtxSynchronize")
    rows = {m: [] for m in modes}
    rcs = {m: set() for m in modes}
    block, rounds = 20, 5
    for r in range(rounds):
        for m in modes[r % 3:] + modes[:r % 3]:
            for i in range(block):
                v0, _ = csw()
                t0 = perf()
                out = engine.decode("X")
                t1 = perf()
                if m == "mx.synchronize":
                    mx.synchronize()
                elif m == "cuCtxSynchronize":
                    rc = sync()
                    if rc:
                        rcs[m].add(drv.name(rc))
                t2 = perf()
                check_token(out.token.item())
                t3 = perf()
                v1, _ = csw()
                if i:   # the first of each block follows another mode
                    rows[m].append(((t3 - t0) / 1e6, (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6, v1 - v0))
    for m in modes:
        p = rows[m]
        row = {"exp": "D", "context": ctx_len, "wait": m, "tokens": len(p),
               **{f"{k}_ms": round(statistics.median(x[i] for x in p), 4)
                  for i, k in enumerate(("total", "dispatch", "wait_call", "item"))},
               "total_ms_p90": round(sorted(x[0] for x in p)[int(0.9 * (len(p) - 1))], 4),
               "vol_cs": round(sum(x[4] for x in p) / len(p), 2), "rc_nonzero": sorted(rcs[m])}
        RESULTS[("D", m)] = row
        emit(row)


def summary(wall_s):
    def get(T, tk, w, k):
        row = RESULTS.get(("A", T, tk, w))
        return None if row is None else row.get(k)

    out = {"summary": True, "wall_s": round(wall_s, 1)}
    for tk in TOKENS:
        out[f"{tk}_end_to_item_us_by_T"] = {str(T): get(T, tk, "item", "end_to_item_us_med") for T in TS_US}
        out[f"{tk}_seen_minus_T_us"] = {w: {str(T): get(T, tk, w, "seen_minus_T_us_med") for T in TS_US}
                                        for w in WAITS}
        out[f"{tk}_soonest_wait_by_T"] = {}
        for T in TS_US:
            cand = [(get(T, tk, w, "seen_us_med"), w) for w in WAITS if get(T, tk, w, "seen_us_med") is not None]
            out[f"{tk}_soonest_wait_by_T"][str(T)] = min(cand)[1] if cand else None
    lo = [v for T in TS_US if T <= 20 and (v := get(T, "gather", "item", "end_to_item_us_med")) is not None]
    hi = [v for T in TS_US if T >= 1000 and (v := get(T, "gather", "item", "end_to_item_us_med")) is not None]
    cs = [v for T in TS_US if T >= 1000 and (v := get(T, "gather", "item", "vol_cs")) is not None]
    if lo and hi:
        growth = statistics.median(hi) - statistics.median(lo)
        out["item_wake_growth_us"] = round(growth, 1)
        out["item_vol_cs_long_T"] = round(statistics.median(cs), 2) if cs else None
        if growth > 100 and cs and statistics.median(cs) >= 0.5:
            out["verdict"] = "supports: .item()'s end-to-return grows with the sleep and the thread sleeps"
        elif growth < 30:
            out["verdict"] = "refutes: .item()'s end-to-return does not grow with the sleep"
        else:
            out["verdict"] = "unclear: see the per-T rows"
    if ("D", "item") in RESULTS:
        base = RESULTS[("D", "item")]["total_ms"]
        out["engine_total_ms"] = {m: RESULTS[("D", m)]["total_ms"] for m in ("item", "mx.synchronize",
                                                                               "cuCtxSynchronize")
                                  if ("D", m) in RESULTS}
        out["engine_saving_vs_item_ms"] = {m: round(base - v, 4) for m, v in out["engine_total_ms"].items()}
    emit(out)


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    engine = "--engine" in argv
    rest = [a for a in argv if a != "--engine"]
    if len(rest) > 1 or (rest and not rest[0].isdigit()):
        fail(f"usage: token_wait.py [context] [--engine]; got {' '.join(argv)!r}", 2)
    ctx_len = int(rest[0]) if rest else 4096
    t_start = time.perf_counter()
    try:
        import mlx.core as mx
        import numpy as np
    except ImportError as e:
        fail(f"needs mlx (CUDA build) and numpy: {e}")
    if not mx.cuda.is_available():
        fail("no CUDA device: mlx.core.cuda.is_available() is False (this probe needs MLX's CUDA backend on an "
             "NVIDIA GPU)")
    try:
        drv = Driver()
    except OSError as e:
        fail(f"cannot load libcuda.so.1: {e}")
    C = drv.C
    dev, nsm, ver = C.c_int(), C.c_int(), C.c_int()
    try:
        drv.must("cuInit", 0)
        drv.must("cuDriverGetVersion", C.byref(ver))
        drv.must("cuDeviceGet", C.byref(dev), 0)
        drv.must("cuDeviceGetAttribute", C.byref(nsm), 16, dev)   # 16: MULTIPROCESSOR_COUNT
        mx.eval(mx.zeros((64,), mx.uint32) + 1)                   # MLX makes its context current here
        ctx = setup_context(drv, dev)
    except Exception as e:
        fail(f"CUDA driver setup failed: {type(e).__name__}: {e}; rcs {drv.rcs}")
    emit({"exp": "head", "probe": "token_wait", "mlx": mx.__version__, "driver": ver.value, "sm": nsm.value,
          "steps": STEPS, "T_us": TS_US, **ctx, "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
          "cpuidle_driver": read_text("/sys/devices/system/cpu/cpuidle/current_driver"),
          "cpuidle_governor": read_text("/sys/devices/system/cpu/cpuidle/current_governor_ro"),
          "MLX_USE_CUDA_GRAPHS": os.environ.get("MLX_USE_CUDA_GRAPHS"), "kernel": KERNEL_NAME,
          "rcs": dict(drv.rcs)})
    try:
        experiment_a(mx, np, drv, nsm.value)
    except Exception as e:
        emit({"exp": "A", "error": f"{type(e).__name__}: {e}", "rcs": dict(drv.rcs)})
    if engine:
        try:
            experiment_d(mx, drv, ctx_len)
        except Exception as e:
            emit({"exp": "D", "error": f"{type(e).__name__}: {e}"})
    summary(time.perf_counter() - t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
