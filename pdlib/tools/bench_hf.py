"""bench-step's strongest peer: Hugging Face transformers' Qwen3 with a static KV cache and
`torch.compile(mode="reduce-overhead")` (CUDA graphs), in FP32 and in bf16, on the same weights, shapes and
contexts as pdlib, measured the same way (the token observed on the host after every decode).

    result = bench_hf(model, dtype="float32", contexts=(1024, 4096, 5120), tokens=200, warmup=20,
                      prefill_tokens=4096, chunk=128, repeats=3)

Only imported when torch is importable (the GPU machine has it; elsewhere it is a test-only extra). FP32
matmuls run without TF32, as pdlib's and mlx-lm's do there (MLX_ENABLE_TF32=0). Decode follows gpt-fast: one
compiled function per token, the position a device tensor advanced in place, the token cloned out of the
graph's output buffer before it is fed back. Prefill (whole, in chunks back to back, and in chunks each
synced) runs eagerly through the same static cache: that is how transformers prefills, and compiling one
graph per chunk length would measure compilation.
"""

import inspect
import statistics
import time

import numpy as np

from pdlib.tools.timing import ms_since, prefills
from pdlib.weights import LoadedModel

DTYPES = ("float32", "bfloat16")


def hf_model(model: LoadedModel, *, dtype: str, device: str):
    """transformers' Qwen3ForCausalLM holding `model`'s weights (SDPA attention), in `dtype` on `device`."""
    import torch
    import transformers

    cfg = model.config
    hf_cfg = transformers.Qwen3Config(
        **{k: v for k, v in cfg.to_hf_dict().items() if k != "model_type"}, attn_implementation="sdpa"
    )
    hf = transformers.Qwen3ForCausalLM(hf_cfg)
    state = {name: torch.from_numpy(np.array(w, copy=True)) for name, w in model.weights.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit transformers' Qwen3: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    return hf.to(device=device, dtype=getattr(torch, dtype)).eval()


def bench_hf(
    model: LoadedModel,
    *,
    dtype: str,
    contexts,
    tokens: int,
    warmup: int,
    prefill_tokens: int,
    chunk: int,
    repeats: int,
    compile_decode: bool = True,
    prompt=None,
) -> dict:
    import torch
    from transformers import StaticCache

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}; expected one of {DTYPES}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    hf = hf_model(model, dtype=dtype, device=device)
    capacity = max(max(contexts), prefill_tokens) + warmup + tokens + 1
    ids = prompt or (lambda n: [(i * 7919 + 13) % min(model.config.vocab_size, 50000) for i in range(n)])

    def new_cache():
        return StaticCache(config=hf.config, max_cache_len=capacity)

    cache_kw = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # 5.24+

    def forward(input_ids, cache_position, cache):
        return hf(input_ids=input_ids, cache_position=cache_position, use_cache=True, **{cache_kw: cache}).logits[:, -1]

    out = {"dtype": dtype, "device": device, "compiled": compile_decode, "decode_ms_median": {}, "decode_ms_all": {}}
    with torch.inference_mode():
        cache = new_cache()  # one cache, reset per context, so the decode step compiles (and captures) once

        def step(tok, pos):
            return forward(tok, pos, cache).argmax(-1, keepdim=True)

        decode = torch.compile(step, mode="reduce-overhead", fullgraph=True) if compile_decode else step
        for ctx in contexts:
            cache.reset()
            prompt_ids = torch.tensor([ids(ctx)], device=device)
            tok = forward(prompt_ids, torch.arange(ctx, device=device), cache).argmax(-1, keepdim=True)
            pos = torch.tensor([ctx], device=device)
            times, first = [], [int(tok.item())]
            for i in range(warmup + tokens):
                t0 = time.perf_counter_ns()
                tok = decode(tok, pos).clone()  # out of the CUDA graph's buffer before the next replay
                first.append(tok.item())
                if i >= warmup:
                    times.append(ms_since(t0))
                pos += 1
            out.setdefault("greedy_tokens", {})[str(ctx)] = first[:8]  # a sanity check, not a gate
            out["decode_ms_median"][str(ctx)] = statistics.median(times)
            out["decode_ms_all"][str(ctx)] = times
        del decode
        prompt_ids = torch.tensor([ids(prefill_tokens)], device=device)

        def prefill(n, synced):
            cache = new_cache()
            sync()
            t0 = time.perf_counter_ns()
            for start in range(0, prefill_tokens, n):
                stop = min(prefill_tokens, start + n)
                logits = forward(prompt_ids[:, start:stop], torch.arange(start, stop, device=device), cache)
                if synced:
                    sync()  # each chunk is its own step, as in a trial
            logits.argmax(-1).item()
            return ms_since(t0) / 1e3

        out.update(prefills(prefill, prefill_tokens=prefill_tokens, chunk=chunk, repeats=repeats))
    return out  # the model and its caches go with this frame; torch's allocator keeps the memory for the next


def available() -> bool:
    """torch and transformers are importable and torch sees a CUDA device (the peer is measured there)."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


__all__ = ["DTYPES", "available", "bench_hf", "hf_model"]
