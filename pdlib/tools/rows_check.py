"""check-kernels' rows for decode attention over a step's decode rows (kernels/decode_rows.py): three rows of a
five-row step, in pool slots out of order, at positions 0, 1,000 and 5,119 of a 5,248-position cache with stale
garbage past each, on the pool's second layer. Each row's output must equal, bit for bit, the single-row kernel's
on a copy of its cache (the same blocks, so the same sums), and the twin's within the tolerance; each row's new
K/V must be in its own slot at its own position and nothing else in the pool changed; the one fence, made from
the rows' three (their least counter), must advance once. Then the engine's decode rows as serving runs them
(`check_engine_rows`), bit for bit against each row attended alone, and as compiled rounds (engine/round.py), within
the tolerance with the same tokens.

    rows = check_decode_rows(seed=0)
"""

import mlx.core as mx

from pdlib.engine import Engine
from pdlib.engine import kernels as K
from pdlib.engine.kernels.decode_rows import decode_rows_kernel, decode_rows_ops, joined_fence
from pdlib.tools.check_rows import compare, evaluated, fence_row
from pdlib.weights import synthetic_model

HQ, HKV, DH, CAP, LAYERS, SLOTS = 16, 8, 128, 5120 + 128, 2, 4
ROWS = [(4, 2, 0), (1, 0, 1000), (2, 3, 5119)]  # (row of the step's q|k|v, slot, position)
LAYER = 1


def check_decode_rows(seed: int) -> list[dict]:
    mx.random.seed(seed * 100 + 77)
    inv_freq = K.rope_inv_freq(DH, base=1e6)
    kw = dict(heads=HQ, kv_heads=HKV, eps=1e-6)
    qkv = mx.random.normal((5, HQ + 2 * HKV, DH)) * 2.0
    qn, kn = 1.0 + 0.1 * mx.random.normal((DH,)), 1.0 + 0.1 * mx.random.normal((DH,))
    shape = (SLOTS, LAYERS, HKV, CAP, DH)
    pool_k, pool_v = mx.random.normal(shape), mx.random.normal(shape)
    for _, slot, pos in ROWS:  # stale garbage from each row's position on: no block may read it
        live = (mx.arange(CAP) < pos)[None, :, None]
        for pool in (pool_k, pool_v):
            pool[slot, LAYER] = mx.where(live, pool[slot, LAYER], 1e4)
    k0, v0 = pool_k + 0.0, pool_v + 0.0  # copies of the pool as it was
    meta = mx.array(ROWS, mx.int32)
    fences = [K.new_fence() + i for i in (2, 0, 1)]  # the joined fence carries the least: the second row's
    layer = mx.array([LAYER, 0, 0, 0], mx.int32)
    # each row alone: the single-row kernel on a copy of its cache, and the twin
    singles, copies = [], []
    for r, slot, pos in ROWS:
        kc, vc = k0[slot, LAYER] + 0.0, v0[slot, LAYER] + 0.0
        copies.append((kc, vc))
        p = mx.array([pos], mx.int32)
        singles.append(K.decode_attention_kernel(qkv[r].reshape(-1), qn, kn, inv_freq, p, kc, vc, K.new_fence(), **kw))
    twin_o, twin_k, twin_v = decode_rows_ops(
        qkv,
        [(r, pos) for r, _, pos in ROWS],
        qn,
        kn,
        inv_freq,
        [(k0[s, LAYER], v0[s, LAYER]) for _, s, _ in ROWS],
        **kw,
    )
    mx.eval(pool_k, pool_v, k0, v0, singles, copies, twin_o, twin_k, twin_v, fences, meta, layer)
    after = joined_fence(fences)
    o, written = decode_rows_kernel(qkv, meta, layer, qn, kn, inv_freq, pool_k, pool_v, after, poison=True, **kw)
    k_now, v_now = K.read_after(pool_k, written), K.read_after(pool_v, written)
    rows, exact = [], []
    for i, (_, slot, pos) in enumerate(ROWS):
        case = f"slot {slot}, pos {pos}"
        exact.append(compare("decode_rows/o = single row", case, o[:, i].reshape(-1), singles[i][0]))
        rows.append(compare("decode_rows/o", case, o[:, i], twin_o[:, i]))
        for part, now, new in (("k", k_now, twin_k[i]), ("v", v_now, twin_v[i])):
            rows.append(compare(f"decode_rows/{part} slot", case, now[slot, LAYER][:, pos], new))
    others = mx.ones(shape[:4], mx.bool_)
    for _, slot, pos in ROWS:
        others[slot, LAYER, :, pos] = False
    for part, now, before in (("k", k_now, k0), ("v", v_now, v0)):
        rows.append(
            compare(
                f"decode_rows/{part} rest",
                "every other slot",
                mx.where(others[..., None], now, 0).reshape(-1),
                mx.where(others[..., None], before, 0).reshape(-1),
            )
        )
    rows.append(fence_row("decode_rows/fence", "3 rows' fences joined", written, fences[1]))
    out = evaluated(exact)
    for row in out:  # the same blocks as the single-row kernel's: the same bits, not merely close
        row["passed"] = row["max_abs"] == 0.0
    return out + evaluated(rows) + check_engine_rows(seed)


ENGINE_PROMPTS = (100, 517, 900)


def _engine_run(model, *, pooled: bool, rounds: str = "step", pairs: int = 2, group: int = 2) -> tuple[list, mx.array]:
    """Three requests prefilled whole, then rounds of their three decodes, a step of two decodes beside a prompt
    chunk, and rounds again, all as ragged steps (`rounds`: PDLIB_DECODE_ROUND, "step" or "compiled"; `pairs`:
    PDLIB_ROUND_PAIRS, 3 for rounds of a pair launch and one decode; `group`: PDLIB_ROUND_GROUP, 3 for each round
    as one launch): every output's (token, logits), and every request's K/V."""
    engine = Engine(model, capacity=1024, slots=4 if pooled else None)
    engine.decode_round, engine.round_pairs, engine.round_group = rounds, pairs, group
    vocab = model.config.vocab_size
    for i, n in enumerate(ENGINE_PROMPTS):
        engine.add_request(f"r{i}", [(j * 7919 + i * 104729) % vocab for j in range(n)])
        engine.prefill_chunk(f"r{i}", n).observe()
    engine.add_request("p", [(j * 31 + 5) % vocab for j in range(200)])
    decodes = [(f"r{i}", None) for i in range(len(ENGINE_PROMPTS))]
    seen = []
    for parts in [decodes] * 3 + [[("r0", None), ("p", 64), ("r2", None)]] + [decodes] * 3:
        seen += [(o.observe(), o.logits) for o in engine.batch(parts) if o is not None]
    kv = mx.concatenate([engine.kv(f"r{i}", 0, n + 7).reshape(-1) for i, n in enumerate(ENGINE_PROMPTS)])
    return seen, kv


def check_engine_rows(seed: int) -> list[dict]:
    """The engine's decode rows as serving runs them (a pool, ragged steps of decode rows, one beside a chunk) on a
    two-layer model of Qwen3-0.6B's shapes, against the same steps with each request's cache its own, which
    attend row by row with the single-row kernel: the same logits, tokens and K/V, bit for bit (later steps read
    the slots earlier ones stored, so a row written to the wrong place shows)."""
    model = synthetic_model("qwen3-0.6b", seed=seed, layers=2)
    (rows, kv_rows), (alone, kv_alone) = _engine_run(model, pooled=True), _engine_run(model, pooled=False)
    case = f"prompts {'/'.join(map(str, ENGINE_PROMPTS))}"
    out = evaluated(
        [
            compare("engine rows/logits", case, stack(rows), stack(alone)),
            compare("engine rows/kv", case, kv_rows, kv_alone),
        ]
    )
    for row in out:  # bit for bit, or the rows are not what each row gets alone
        row["passed"] = row["max_abs"] == 0.0 and [t for t, _ in rows] == [t for t, _ in alone]
    # the rounds compiled (engine/round.py): the same launches, so within the tolerance of each row alone and
    # the same tokens (a row stored in a wrong slot shows in the rounds after it)
    # and as pair launches (PDLIB_ROUND_PAIRS), or each round one launch (PDLIB_ROUND_GROUP): the persistent
    # kernel's arithmetic, so within the tolerance too
    for label, kw in (
        ("compiled", {"rounds": "compiled"}),
        ("pairs", {"pairs": 3}),
        ("groups", {"pairs": 3, "group": 3}),
    ):
        seen, kv = _engine_run(model, pooled=True, **kw)
        more = evaluated(
            [
                compare(f"engine rows {label}/logits", case, stack(seen), stack(alone)),
                compare(f"engine rows {label}/kv", case, kv, kv_alone),
            ]
        )
        for row in more:
            row["passed"] = row["passed"] and [t for t, _ in seen] == [t for t, _ in alone]
        out += more
    return out


def stack(seen: list) -> mx.array:
    return mx.stack([lg for _, lg in seen])
