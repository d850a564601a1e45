"""check-kernels' rows for the persistent decode kernel (engine/kernels/persistent_decode.py): one request's
and a pair's steps against the ops twin, the stale-cache slots, the write fence, the timeout and the mailbox.

    rows = check_persistent_decode(seed=0)
"""

import mlx.core as mx
import numpy as np

from pdlib.config import preset
from pdlib.engine import kernels as K
from pdlib.tools.check_rows import bf16_normal, compare, evaluated, fence_row, slot_rows


def random_decode_weights(L: int, D: int, Hq: int, Hkv: int, Dh: int, F: int, V: int) -> "K.DecodeWeights":
    norm = lambda *shape: 1.0 + 0.1 * mx.random.normal(shape)  # noqa: E731
    return K.DecodeWeights(
        embed=mx.random.normal((V, D)),
        qkv=bf16_normal((L, (Hq + 2 * Hkv) * Dh, D), D**-0.5),
        o=bf16_normal((L, D, Hq * Dh), (Hq * Dh) ** -0.5),
        gate_up=bf16_normal((L, 2 * F, D), D**-0.5),
        down=bf16_normal((L, D, F), F**-0.5),
        lm_head=bf16_normal((V, D), D**-0.5),
        in_norm=norm(L, D),
        post_norm=norm(L, D),
        q_norm=norm(L, Dh),
        k_norm=norm(L, Dh),
        norm=norm(D),
        inv_freq=K.rope_inv_freq(Dh, base=1e6),
    )


def persistent_case(
    seed: int, *, L: int, pos: int, cap: int, sync: mx.array, blocks: int | None = None, fold: bool = False
) -> list:
    """One decode step in one launch against its ops twin at Qwen3-0.6B's layer shapes, fresh random weights:
    the logits; the token (the twin's logit at the kernel's token is the twin's maximum: a near tie may pick
    either); pos + 1; every layer's new K and V slot; every other slot as it was (stale garbage past pos
    included, which no block may read); the cache's fence advanced once. The caches are one array each,
    (L, Hkv, cap, Dh), as KVCache holds them on a GPU. `fold`: o_proj folded into attention."""
    D, Hq, Hkv, Dh, F, V = 1024, 16, 8, 128, 3072, 151936
    kw = dict(heads=Hq, kv_heads=Hkv, eps=1e-6)
    mx.random.seed(seed)
    dw = random_decode_weights(L, D, Hq, Hkv, Dh, F, V)
    kc, vc = _stale_caches((L, Hkv, cap, Dh), pos)
    fence = K.new_fence() + seed % 7
    token, p = mx.array(pos * 37 % V, mx.uint32), mx.array([pos], mx.int32)
    want = K.decode_persistent_ops(token, p, dw, kc, vc, fence, **kw)
    kc0, vc0 = kc + 0.0, vc + 0.0
    mx.eval(dw, want, kc, vc, kc0, vc0, fence)
    got = K.decode_persistent(token, p, dw, kc, vc, fence, sync, poison=True, blocks=blocks, fold=fold, **kw)
    case = f"{L} layers, pos {pos}" + (f", {blocks} blocks" if blocks else "") + (", folded" if fold else "")
    return evaluated(_decode_rows(case, got, want, p=p, caches=(kc, vc), before=(kc0, vc0), fence=fence))


def _stale_caches(shape: tuple, pos: int) -> tuple[mx.array, mx.array]:
    """K and V caches of `shape` (L, Hkv, cap, Dh): random before pos, stale garbage (1e4) from it, which no
    block may read."""
    live = (mx.arange(shape[2]) < pos)[None, :, None]
    kc = mx.where(live, mx.random.normal(shape), 1e4)
    return kc, mx.where(live, mx.random.normal(shape), 1e4)


def _decode_rows(
    case: str, got: tuple, want: tuple, *, p: mx.array, caches: tuple, before: tuple, fence: mx.array
) -> list:
    """One request's step (got: the kernel's (logits, token, pos + 1, _, _, fence); want: its ops twin's) against
    the twin: the logits; the token (the twin's logit at the kernel's token is the twin's maximum: a near tie may
    pick either); pos + 1; every layer's new K and V slot in `caches`, every other slot as `before`; the fence
    advanced once."""
    logits, tok, next_pos, _, _, written = got
    pos = int(p[0].item())
    rows = [
        compare("persistent/logits", case, logits, want[0]),
        compare("persistent/token", case, want[0][tok.astype(mx.int32)], mx.max(want[0])),
        compare("persistent/pos", case, next_pos.astype(mx.float32), (p + 1).astype(mx.float32)),
        fence_row("persistent/fence", case, written, fence),
    ]
    for part, cache, old, new in (("k", caches[0], before[0], want[3]), ("v", caches[1], before[1], want[4])):
        after = K.read_after(cache, written)
        L = cache.shape[0]
        rows += slot_rows(
            f"persistent/{part}",
            case,
            [after[j] for j in range(L)],
            [old[j] for j in range(L)],
            [n[:, 0] for n in new],
            pos,
        )
    return rows


def persistent_pair_case(
    seed: int, *, L: int, positions: tuple, cap: int, sync: mx.array, blocks: int | None = None
) -> list:
    """Two or more requests' decode steps in one launch (decode_persistent_group: a pair, or a group of up to
    MAX_GROUP) against each one's ops twin, as `persistent_case` checks one: per request the logits, the token,
    pos + 1, every layer's new K and V slot, every other slot of its cache as it was, each fence advanced once.
    The caches hold different contents and the requests different tokens and positions, so a request that read
    another's shows."""
    D, Hq, Hkv, Dh, F, V = 1024, 16, 8, 128, 3072, 151936
    kw = dict(heads=Hq, kv_heads=Hkv, eps=1e-6)
    mx.random.seed(seed)
    dw = random_decode_weights(L, D, Hq, Hkv, Dh, F, V)
    reqs, before = [], []
    for q, pos in enumerate(positions):
        kc, vc = _stale_caches((L, Hkv, cap, Dh), pos)
        token, p = mx.array((pos * 37 + 11 * q) % V, mx.uint32), mx.array([pos], mx.int32)
        reqs.append((token, p, kc, vc, K.new_fence() + (seed + q) % 7))
        before.append((kc + 0.0, vc + 0.0))
    want = K.decode_persistent_group_ops(reqs, dw, **kw)
    mx.eval(dw, want, reqs, before)
    got = K.decode_persistent_group(reqs, dw, sync, poison=True, blocks=blocks, **kw)
    rows, kind = [], "pair" if len(positions) == 2 else f"group of {len(positions)}"
    for q, ((_, p, kc, vc, fence), old, w, g) in enumerate(zip(reqs, before, want, got)):
        case = f"{kind} {'+'.join(map(str, positions))}, {chr(65 + q)}, {L} layers"
        rows += _decode_rows(
            case + (f", {blocks} blocks" if blocks else ""), g, w, p=p, caches=(kc, vc), before=old, fence=fence
        )
        mx.eval([r["stats"] for r in rows])  # each request's compared before the next's temporaries (8 caches)
    return evaluated(rows)


def check_persistent_groups(seed: int) -> list[dict]:
    """More than two requests a launch (a decode round as one launch, PDLIB_ROUND_GROUP): 3, 4 and 8 requests of
    28 layers at positions spread from 0 to the cache's last slot, each group on its own sync buffer (their
    staged vectors after attention's ring; eight leave three stages of it), and a group of 8 on a grid of 6
    blocks (many items a block)."""
    P, cap = K.persistent_decode, 4096 + 64
    if P.largest_group(preset("qwen3-0.6b"), packed=True) < 8:
        return []
    rows = []
    for i, positions in enumerate(
        [(0, 639, 4095), (7, 2048, cap - 1, 1), (0, 1, 639, 1000, 2047, 2048, 4095, cap - 1)]
    ):
        rows += persistent_pair_case(seed * 100 + 110 + i, L=28, positions=positions, cap=cap, sync=P.new_sync())
    rows += persistent_pair_case(
        seed * 100 + 119, L=2, positions=tuple(range(5, 13)), cap=64, sync=P.new_sync(), blocks=6
    )
    return rows


def check_persistent_pairs(seed: int, tiny_pair, too_many: int) -> list[dict]:
    """Two requests a launch: 28 layers with the positions far apart and swapped about (0 and 4,095, then 639
    and the cache's last slot) on one pair's sync buffer (afterwards its barrier count and every block's flag at
    2 steps' barriers, each (request, head)'s count at 2 steps' items: the pair's splits are half as many); a
    grid of 6 blocks (several items a block); a grid too large to be resident gives both requests ERROR_TOKEN,
    flags the buffer and the error sticks; a second request's position past its cache fails both requests
    (and is no barrier's timeout); then `check_persistent_pair_mailbox`. `tiny_pair(sync, blocks, positions)`
    runs one small pair step and returns both tokens, evaluated."""
    P = K.persistent_decode
    rows, cap, L, Hkv, nb = [], 4096 + 64, 28, 8, P.sm_count()
    sync = P.new_sync()
    for i, positions in enumerate([(0, 4095), (639, cap - 1)]):
        rows += persistent_pair_case(seed * 100 + 70 + i, L=L, positions=positions, cap=cap, sync=sync)
    barriers, items = 2 * P.barriers_per_layer(False) * L, 2 * max(1, nb // (2 * Hkv)) * L
    want = (
        mx.zeros(sync.shape)
        .at[P.SY_EPOCH]
        .add(barriers)
        .at[P.SY_FLAGS : P.SY_FLAGS + nb]
        .add(barriers)
        .at[P.SY_HEAD : P.SY_HEAD + 2 * Hkv]
        .add(items)
    )
    rows += evaluated([compare("persistent/sync buffer", "pair, after 2 steps", sync.astype(mx.float32), want)])
    rows += persistent_pair_case(seed * 100 + 80, L=2, positions=(639, 100), cap=640, sync=P.new_sync(), blocks=6)
    sync = P.new_sync()
    first = tiny_pair(sync, too_many, (0, 3))
    again = tiny_pair(sync, 2, (0, 3))  # a grid that fits, on the flagged buffer
    rows += evaluated(
        [
            compare(
                "persistent/barrier timeout",
                f"pair, {too_many} blocks, then 2",
                mx.stack([*first, sync[P.SY_ERR], *again]).astype(mx.float32),
                mx.array([P.ERROR_TOKEN] * 2 + [1] + [P.ERROR_TOKEN] * 2).astype(mx.float32),
            )
        ]
    )
    sync = P.new_sync()
    past = tiny_pair(sync, 2, (0, 32))  # tiny_pair's caches hold 32 slots
    rows += evaluated(
        [
            compare(
                "persistent/bad input",
                "pair, B's position past its cache",
                mx.stack([*past, sync[P.SY_ERR]]).astype(mx.float32),
                mx.array([P.ERROR_TOKEN, P.ERROR_TOKEN, 0]).astype(mx.float32),
            )
        ]
    )
    return rows + check_persistent_pair_mailbox(tiny_pair)


def check_persistent_pair_mailbox(tiny_pair) -> list[dict]:
    """A pair's sync buffer naming a mailbox area for each request: two steps (positions 0 and 5, then 1 and 21,
    21 reusing 5's slot) leave each request's position + 1 and token in its own area's slot, and nothing else in
    the region changes (a token written into both areas fails; earlier users' words elsewhere in the region do
    not)."""
    P, M = K.persistent_decode, K.mailbox
    region = M.region()
    boxes = [region.take(), region.take()]
    sync, got, want, slots = P.new_sync(*(b.address for b in boxes)), [], [], set()
    before = region.words.copy()  # earlier users' areas keep their last words: only changes count
    for positions in ((0, 5), (1, 21)):
        for box, pos in zip(boxes, positions):
            box.clear(pos)
        toks = tiny_pair(sync, 2, positions)
        for box, pos, tok in zip(boxes, positions, toks):
            seen = box.wait(pos, timeout_ns=2_000_000_000)
            got += [-1 if seen is None else seen, int(box.words[pos % M.SLOTS]) >> 32]
            want += [tok.item(), pos + 1]
            slots.add((box.address - region.address) // 8 + pos % M.SLOTS)
    got.append(int(np.count_nonzero(np.delete(region.words != before, sorted(slots)))))
    want.append(0)
    for box in boxes:
        region.give_back(box)
    return evaluated(
        [compare("persistent/mailbox", "pair, 2 steps", mx.array(got, mx.float32), mx.array(want, mx.float32))]
    )


def tiny_step(sync: mx.array, blocks: int, fold: bool = False, pos: int = 0) -> mx.array:
    """One step of a one-layer, one-KV-head model in one persistent launch of `blocks` blocks on `sync`: its
    token, evaluated (the sync buffer is written in place, not an output: read it only after the kernel ran)."""
    cache = mx.zeros((1, 1, 32, 128))
    _, tok, *_ = K.decode_persistent(
        mx.array(5, mx.uint32),
        mx.array([pos], mx.int32),
        random_decode_weights(1, 256, 2, 1, 128, 512, 1024),
        cache,
        cache + 0.0,
        K.new_fence(),
        sync,
        heads=2,
        kv_heads=1,
        eps=1e-6,
        blocks=blocks,
        fold=fold,
    )
    mx.eval(tok)
    return tok


def check_persistent_decode(seed: int) -> list[dict]:
    """The persistent decode kernel (`persistent_case`), as it runs and with o_proj folded into attention,
    each: 28 layers at positions 0, 639, 4,095 and the cache's last slot, one sync buffer reused by all of
    them, as a request's steps reuse theirs (afterwards its barrier count and every block's flag stand at 4
    steps' barriers, each head's count at 4 steps' attention items, and every other word is zero); a grid of
    6 blocks, so each block takes several attention items; last, a grid too large to be resident must come
    back as ERROR_TOKEN within the barrier's timeout, not hang, and the error must stick: the next launch on
    that buffer fails too. Then the mailbox (check_persistent_mailbox), two requests a launch
    (check_persistent_pairs) and more (check_persistent_groups)."""
    P = K.persistent_decode
    if not P.available(preset("qwen3-0.6b"), packed=True):
        return []

    rows, cap, L, Hkv, nb = [], 4096 + 64, 28, 8, P.sm_count()
    too_many = 16 * nb  # more blocks of 256 threads than the device holds at once
    for fold in (False, True):
        folded = ", folded" if fold else ""
        sync = P.new_sync()
        for i, pos in enumerate([0, 639, 4095, cap - 1]):
            rows += persistent_case(seed * 100 + 50 + i, L=L, pos=pos, cap=cap, sync=sync, fold=fold)
        # read after the launches ran (evaluated)
        barriers, items = 4 * P.barriers_per_layer(fold) * L, 4 * max(1, nb // Hkv) * L
        want = (
            mx.zeros(sync.shape)
            .at[P.SY_EPOCH]
            .add(barriers)
            .at[P.SY_FLAGS : P.SY_FLAGS + nb]
            .add(barriers)
            .at[P.SY_HEAD : P.SY_HEAD + Hkv]
            .add(items)
        )
        rows += evaluated([compare("persistent/sync buffer", "after 4 steps" + folded, sync.astype(mx.float32), want)])
        rows += persistent_case(seed * 100 + 60, L=2, pos=639, cap=640, sync=P.new_sync(), blocks=6, fold=fold)
        sync = P.new_sync()
        first = tiny_step(sync, too_many, fold)
        again = tiny_step(sync, 2, fold)  # a grid that fits, on the flagged buffer
        rows += evaluated(
            [
                compare(
                    "persistent/barrier timeout",
                    f"{too_many} blocks, then 2" + folded,
                    mx.stack([first, sync[P.SY_ERR], again]).astype(mx.float32),
                    mx.array([P.ERROR_TOKEN, 1, P.ERROR_TOKEN]).astype(mx.float32),
                )
            ]
        )

    def tiny_pair(sync, blocks, positions):
        dw = random_decode_weights(1, 256, 2, 1, 128, 512, 1024)
        caches = [mx.zeros((1, 1, 32, 128)) for _ in positions]
        reqs = [
            (mx.array(5 + q, mx.uint32), mx.array([pos], mx.int32), c, c + 0.0, K.new_fence())
            for q, (pos, c) in enumerate(zip(positions, caches))
        ]
        out = K.decode_persistent_group(reqs, dw, sync, heads=2, kv_heads=1, eps=1e-6, blocks=blocks)
        toks = [o[1] for o in out]
        mx.eval(toks)  # the sync buffer is written in place: read it only after the kernel ran
        return toks

    rows += check_persistent_mailbox(tiny_step, too_many) + check_persistent_pairs(seed, tiny_pair, too_many)
    return rows + check_persistent_groups(seed)


def check_persistent_mailbox(tiny_step, too_many: int) -> list[dict]:
    """PDLIB_TOKEN_READ=mailbox: steps at positions 0, 1 and 17 (17 reuses 1's slot) on a sync buffer naming a
    mailbox area each leave position + 1 and the kernel's token in their slot, and nothing else in the region
    changes; a step that fails (a grid too large, on its own buffer and area) leaves its slot empty, so the
    host's wait times out and `.item()` reports the error. `tiny_step(sync, blocks, fold, pos)` runs one step
    (check_persistent_decode's) and returns its token, evaluated."""
    M = K.mailbox
    region = M.region()
    box, other = region.take(), region.take()
    sync, got, want = K.persistent_decode.new_sync(box.address), [], []
    before = region.words.copy()  # earlier users' areas keep their last words: only changes count
    for pos in (0, 1, 17):
        box.clear(pos)
        tok = tiny_step(sync, 2, False, pos=pos)
        seen = box.wait(pos, timeout_ns=2_000_000_000)
        got += [-1 if seen is None else seen, int(box.words[pos % M.SLOTS]) >> 32]
        want += [tok.item(), pos + 1]
    mine = (box.address - region.address) // 8
    changed = np.delete(region.words != before, [mine, mine + 1])
    other.clear(0)
    tiny_step(K.persistent_decode.new_sync(other.address), too_many, False, pos=0)
    got += [int(np.count_nonzero(changed)), -1 if other.wait(0, timeout_ns=50_000_000) is None else 1]
    want += [0, -1]
    region.give_back(box)
    region.give_back(other)
    return evaluated(
        [
            compare(
                "persistent/mailbox",
                "3 steps, then a failed one",
                mx.array(got, mx.float32),
                mx.array(want, mx.float32),
            )
        ]
    )
