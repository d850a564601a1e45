"""Two processes, one GPU each, all_sum a 940 MB vector (one 4K-token FP32 K/V cache of Qwen3-0.6B) twice
over MLX's NCCL backend: rank 1 holds 7.5, rank 0 zeros, so both must print 7.5. Started by session.sh."""
import time

import mlx.core as mx

g = mx.distributed.init(strict=True, backend="nccl")
x = mx.full((940_000_000 // 4,), 7.5 if g.rank() == 1 else 0.0, dtype=mx.float32)
mx.eval(x)
for i in range(3):
    t0 = time.perf_counter()
    y = mx.distributed.all_sum(x, group=g)
    mx.eval(y)
    ms = (time.perf_counter() - t0) * 1e3
    print(f"rank {g.rank()} all_sum {i}: first {y[0].item()} last {y[-1].item()} {ms:.2f} ms", flush=True)
