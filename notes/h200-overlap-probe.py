"""Why overlap ran serially on the H200: time A's decode while B's whole prefill is in flight on another stream.
Variants: B on a new stream, A on the default (as pdlib does); the reverse; and host timings of each call."""
import json, os, sys, time
import mlx.core as mx
from pdlib.config import RunParams
from pdlib.experiment import Experiment

p = RunParams(model="qwen3-0.6b", prompt_tokens=4096, output_tokens=64, chunk_size=128, policies=("chunked",),
              logical_cache_reset=True)
exp = Experiment(p); e = exp.engine
def ms(t): return round((time.perf_counter() - t) * 1e3, 3)
def setup():
    for r in "AB": e.reset(r, logical=True)
    for _ in range(32): e.prefill_chunk("A", 128)
    e.decode("A").token.item(); mx.synchronize()
s2 = mx.new_stream(mx.gpu)
out = {}
for variant in ["B on s2", "A on s2", "B on s2", "A on s2"]:
    setup()
    sb, sa = (s2, mx.default_stream(mx.gpu)) if variant == "B on s2" else (mx.default_stream(mx.gpu), s2)
    t0 = time.perf_counter()
    with mx.stream(sb):
        ob = e.prefill_chunk("B", 4096)
    t_build = ms(t0)
    a = []
    for _ in range(8):
        with mx.stream(sa):
            o = e.decode("A")
        o.token.item(); a.append(ms(t0))
    ob.token.item(); t_b = ms(t0)
    out.setdefault(variant, []).append({"build_ms": t_build, "a_emits_ms": a, "b_done_ms": t_b})
    print(variant, out[variant][-1], flush=True)
setup(); t0 = time.perf_counter(); ob = e.prefill_chunk("B", 4096); ob.token.item(); out["B alone ms"] = ms(t0)
setup(); t0 = time.perf_counter(); [e.decode("A").token.item() for _ in range(8)]; out["8 A decodes alone ms"] = ms(t0)
print(out["B alone ms"], out["8 A decodes alone ms"])
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "overlap-probe.json"), "w"), indent=1)
