"""Decode as one persistent kernel per token (CUDA): every layer, the final norm, the LM head and the greedy pick
in one launch, phases separated by a software grid barrier, so a token costs one launch and one host read.

    dw = DecodeWeights(embed=..., qkv=mx.stack(...), ...)      # the layers' decode matrices stacked per kind
    sync = new_sync()                                           # one per request, reused by its every step
    logits, token, next_pos, ks, vs, written = decode_persistent(token, pos, dw, cache.k_all, cache.v_all,
                                                                 cache.written, sync, heads=16, kv_heads=8, eps=1e-6)
    (la, ta, pa, wa), (lb, tb, pb, wb) = decode_persistent_group(   # two (up to 8) requests, one launch, their sync
        [(tok_a, pos_a, ka, va, fa), (tok_b, pos_b, kb, vb, fb)], dw, new_sync(), heads=16, kv_heads=8, eps=1e-6)

Same contract as Qwen3.decode_step, over the cache's stacked K and V (L, Hkv, capacity, Dh) so that the launch
takes few buffers (MLX's host work grows with them): the new K/V slots are stored in place (ks, vs are
empty) and the cache's write fence comes back advanced (fence.py). The arithmetic is the per-operation
kernels' (gemv.py, decode_attention.py): bf16 weights, FP32 accumulation, the same online softmax. Per
layer, five phases:

    1 RMSNorm(h) in every block, q|k|v rows spread over all warps                      grid barrier
    2 q/k norm + RoPE, the new slot stored, split-K attention: (KV head, split) items;
      the last block to finish a head merges its splits into o                         grid barrier
    3 o_proj + residual into h (each row read and written by one warp)                  grid barrier
    4 RMSNorm(h) + gate|up + SwiGLU into act                                            grid barrier
    5 down + residual into h                                                            grid barrier

With o_proj folded into attention (PDLIB_PERSISTENT_FOLD=1, `fold`; off by default, being slower), phase 3
goes: every item of a head waits for the head's others, merges it and applies its columns of W_o to its share
of the rows; phase 4 adds the heads' parts to the layer's input in head order. Four phases, four barriers.
Then RMSNorm + LM head with a per-block argmax, and the last block to finish picks the token.
Each warp requests its next phase's first weight rows before it waits at a barrier (weights do not depend on
it; with PDLIB_PERSISTENT_LOAD=late, after staging the phase's vectors instead: the same values, 177-218
registers and no spills where early takes 254-255 and mostly spills, and on an H100 a launch of 6 or 8
requests ~3% faster, too little yet to change the default: docs/engine.md), and each block its first
attention item's keys and values (the Tensor Memory Accelerator streams them into a ring of stages in dynamic
shared memory, 128 KB in flight per SM, without holding registers).

Co-residency: a grid barrier deadlocks if a block is never scheduled, so the grid is one block per SM (read
from the driver), 256 threads, ~23 KB (a pair's ~35 KB) of static and 128 KB of dynamic shared memory: always
resident.
Behind that, every wait (at a barrier, or for a stage of the ring) has a timeout: a block that waits ~1 s
flags an error in the sync buffer, every block then leaves, and the step's token comes back as ERROR_TOKEN,
which `check_token` turns into a clear error on the host (the flag stays set, so later steps fail too
rather than run on a broken barrier). Data that other blocks wrote in this launch is read through L2, never a
stale L1 line (__ldcg, and cp.async.cg for the staged vectors, all of a phase's requested at once), and written
with __stcg. The barrier is a flag per block in the sync buffer (a few words and MAX_BLOCKS flags, ~17 KB): no
block waits on a contended counter (MLX keeps arrays of 8 bytes or less in managed memory, where a barrier is
slow). With PDLIB_TOKEN_READ=mailbox the last block also leaves the token in pinned host memory, where the host
polls for it (mailbox.py; the sync buffer holds the address).
Two requests decode in one launch where a step carries both (decode_persistent_group; the same BODY with NR = 2,
its second request's buffers in PAIR_INPUTS): each phase stages both vectors and multiplies every weight row it
loads by both, so the weights are read and the barriers paid once for two tokens; attention's items are
(request, KV head, split), with half the splits per head. A group of three to MAX_GROUP requests
(decode_persistent_group, each further request's buffers in other_inputs(q)) stages them all, in dynamic
shared memory after the ring (group_stages: eight of Qwen3-0.6B's leave room for three stages of the ring, not
four). A group of 8 runs its weight phases on tensor cores: 16-row tiles of W times the vectors as mma's 8
columns, each vector in three exact bf16 parts (as the compiled rounds' GEMM), a tile's columns split over up
to 8 warps of a block; read per row or two, as smaller groups' FMAs read them, 8 vectors ask shared memory for
more than it serves (at 4 the tiles took twice the FMAs' time: docs/engine.md).
Metal has no co-residency guarantee, so there the per-operation kernels stay.
The CUDA is in persistent_decode.cuh and persistent_tiles.cuh (device functions: HEADER, with gemm.cuh's mma)
and persistent_decode.cu (the body: BODY); this module holds its layout, its launch and its ops twin.
"""

from dataclasses import dataclass

import mlx.core as mx

from pdlib import settings
from pdlib.engine.kernels.backend import BACKEND, CUDA_CP_ASYNC, PRELUDE, cuda_sm_count, float_bits, source
from pdlib.engine.kernels.decode_attention import QK_NORM_ROPE, decode_attention_ops
from pdlib.engine.kernels.gemv import gemv_ops
from pdlib.engine.kernels.slices import current_sms

BLOCK = 256
FOLD_ENV, BLOCKS_ENV, LOAD_ENV = "PDLIB_PERSISTENT_FOLD", "PDLIB_PERSISTENT_BLOCKS", "PDLIB_PERSISTENT_LOAD"
MAX_BLOCKS = 4096  # the sync buffer's block flags
SY_BOX, SY_EPOCH, SY_ERR, SY_HEAD, SY_FLAGS = 0, 32, 64, 128, 256  # the sync buffer's words (HEADER's enum)
SYNC_WORDS = SY_FLAGS + MAX_BLOCKS
ERROR_TOKEN = 0xFFFFFFFF
SPIN_CYCLES = 2_000_000_000  # ~1 s at a ~2 GHz SM clock before a wait gives up
KV_GROUP = 4  # keys per warp per stage of attention's ring
KV_STAGES = 4  # stages of the ring in flight (each BLOCK / 32 * KV_GROUP keys, K and V)


@dataclass(frozen=True)
class DecodeWeights:
    """The decode step's weights with the layers stacked per kind (one pointer each for the kernel)."""

    embed: mx.array  # (V, D) FP32, the input embedding
    qkv: mx.array  # (L, (Hq + 2 Hkv) Dh, D) bf16
    o: mx.array  # (L, D, Hq Dh) bf16
    gate_up: mx.array  # (L, 2 F, D) bf16: gate rows, then up rows
    down: mx.array  # (L, D, F) bf16
    lm_head: mx.array  # (V, D) bf16
    in_norm: mx.array  # (L, D)
    post_norm: mx.array  # (L, D)
    q_norm: mx.array  # (L, Dh)
    k_norm: mx.array  # (L, Dh)
    norm: mx.array  # (D,) the final norm
    inv_freq: mx.array  # (Dh / 2,) RoPE


def decode_persistent_ops(
    token,
    pos,
    dw: DecodeWeights,
    k_all,
    v_all,
    written,
    sync=None,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    poison: bool = False,
):
    """The oracle: Qwen3.decode_step's ops path over the stacked weights and caches (L, Hkv, cap, Dh) ->
    (logits, token, pos + 1, ks, vs, written), the new rows (Hkv, 1, Dh) per layer for the caller to store
    and the fence unchanged."""
    h = dw.embed[token].reshape(dw.embed.shape[1])
    ks, vs = [], []
    for i in range(k_all.shape[0]):
        qkv = gemv_ops(h, dw.qkv[i], norm=dw.in_norm[i], eps=eps)
        o, k, v = decode_attention_ops(
            qkv,
            dw.q_norm[i],
            dw.k_norm[i],
            dw.inv_freq,
            pos,
            k_all[i],
            v_all[i],
            heads=heads,
            kv_heads=kv_heads,
            eps=eps,
        )
        h = gemv_ops(o, dw.o[i], residual=h)
        act = gemv_ops(h, dw.gate_up[i], norm=dw.post_norm[i], eps=eps, swiglu=True)
        h = gemv_ops(act, dw.down[i], residual=h)
        ks.append(k[:, None])
        vs.append(v[:, None])
    logits = gemv_ops(h, dw.lm_head, norm=dw.norm, eps=eps)
    return logits, mx.argmax(logits), pos + 1, ks, vs, written


# the prelude for the q/k norm + RoPE + store it shares with decode_attention_partial.cu
HEADER = (
    PRELUDE["cuda"]
    + QK_NORM_ROPE
    + CUDA_CP_ASYNC
    + source("gemm.cuh")
    + source("persistent_decode.cuh")
    + source("persistent_tiles.cuh")
)

BODY = source("persistent_decode.cu")

INPUTS = "tok pos embed wqkv wo wgu wdown lm in_norm post_norm q_norm k_norm fnorm inv_freq sync_buf kc vc fin".split()
OUTPUTS = ["logits", "tok_out", "pos_out", "scratch", "stamps", "fout"]
MAX_GROUP = 8  # requests a launch (the sync buffer has mailbox words for 16; shared memory fits 8 of Qwen3-0.6B)


def other_inputs(q: int) -> tuple[list, list]:
    """Request q's (q >= 1) input and output names in a launch of several: tok1, pos1, ... fout1 for the second."""
    return [f"tok{q}", f"pos{q}", f"kc{q}", f"vc{q}", f"fin{q}"], [f"fout{q}"]


PAIR_INPUTS, PAIR_OUTPUTS = other_inputs(1)  # the second request's
_kernels: dict = {}


TILES_FROM = 8  # requests from which the weight phases run on tensor cores (persistent_tiles.cuh; docs/engine.md)
STAMPS_PER_LAYER = 14  # a profile's marks a layer (the kernel's SPL; tools/profile_group.py reads them)


def source(requests: int) -> str:
    """BODY for `requests` a launch: PDP_REQS(tok, tok1) lists tok, tok1, tok2, ... (other_inputs' names); past a
    pair, PDP_GROUP (the staged vectors in dynamic shared memory); from TILES_FROM, PDP_TILES."""
    group = "#define PDP_GROUP\n" if requests > 2 else ""
    tiles = "#define PDP_TILES\n" if requests >= TILES_FROM else ""
    return group + tiles + "#define PDP_REQS(a, b) a" + "".join(f", a##{q}" for q in range(1, requests)) + "\n" + BODY


def ring_bytes(dh: int, kv_group: int = KV_GROUP, stages: int = KV_STAGES) -> int:
    """The dynamic shared memory of attention's ring: `stages` stages of K and V rows."""
    return stages * 2 * (BLOCK // 32) * kv_group * dh * 4


def staged_bytes(*, D: int, F: int, dh: int, heads: int, requests: int) -> int:
    """A group's staged vectors (more than two requests), in dynamic shared memory after the ring, with tiles
    (from TILES_FROM requests) a float4 of padding each and the tiles' parts (each warp's 2 x 128 floats); 0 for
    one request or a pair, whose vectors are static."""
    pad, parts = (4, 4 * (BLOCK // 32) * 2 * 128) if requests >= TILES_FROM else (0, 0)
    return 4 * requests * (max(D, heads * dh, F) + pad) + parts if requests > 2 else 0


def kernel(dh: int, kv_group: int, requests: int, dynamic: int):
    """The kernel for a head size, load group and requests a launch (1 to MAX_GROUP), built once (CUDA only);
    `dynamic`: its dynamic shared memory (the ring's, and a group's staged vectors)."""
    if (dh, kv_group, requests, dynamic) not in _kernels:
        extra = [other_inputs(q) for q in range(1, requests)]
        _kernels[dh, kv_group, requests, dynamic] = mx.fast.cuda_kernel(
            name="pdlib_decode_persistent" + {1: "", 2: "_pair"}.get(requests, f"_group{requests}"),
            input_names=INPUTS + [n for i, _ in extra for n in i],
            output_names=OUTPUTS + [n for _, o in extra for n in o],
            source=source(requests),
            header=HEADER,
            shared_memory=dynamic,
        )
    return _kernels[dh, kv_group, requests, dynamic]


def sm_count() -> int:
    """Streaming multiprocessors of CUDA device 0 (backend.cuda_sm_count); PDLIB_PERSISTENT_BLOCKS overrides it
    (fewer blocks stay co-resident; more may deadlock, which the barrier's timeout reports). Inside an SM
    slice's `active()` block (slices.py), at most that slice's SMs: a block past them would never be resident."""
    within = current_sms()
    asked = settings.get(BLOCKS_ENV) or within or cuda_sm_count()
    return min(asked, within) if within else asked


def new_sync(*mailboxes: int) -> mx.array:
    """A barrier's sync buffer: zeros, SYNC_WORDS words, reused by every step that is given it (its barrier count,
    block flags and heads' counts only grow), but for SY_BOX + 2 q and the word after it: `mailboxes[q]`, the
    device address of request q's token mailbox area (mailbox.py), where each step's last block also leaves
    its token; 0 for none. One per request, or per pair of requests that decode in one launch: two decodes
    that could run at once must not share one."""
    if len(mailboxes) > MAX_GROUP:
        raise ValueError(f"{len(mailboxes)} mailboxes: a launch decodes 1 to {MAX_GROUP} requests")
    s = mx.zeros((SYNC_WORDS,), mx.uint32)
    if any(mailboxes):
        words = [w for box in mailboxes for w in (box & 0xFFFFFFFF, box >> 32)]
        s = mx.concatenate([mx.array(words, mx.uint32), s[len(words) :]])
    mx.eval(s)
    return s


SHARED_LIMIT = 48 * 1024  # static shared memory a block may declare
SM_SHARED_LIMIT = 227 * 1024  # static and dynamic together, one block per SM (sm_90)


def shared_bytes(cfg, *, fold: bool = True, requests: int = 1) -> int:
    """The kernel's static shared memory for a model config's shapes (static_shared_bytes; by default one request
    with o_proj folded, the larger; a pair never folds)."""
    return static_shared_bytes(
        D=cfg.hidden_size,
        F=cfg.intermediate_size,
        dh=cfg.head_dim,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        fold=fold and requests == 1,
        requests=requests,
    )


def static_shared_bytes(*, D: int, F: int, dh: int, heads: int, kv_heads: int, fold: bool, requests: int = 1) -> int:
    """The kernel's static shared memory (BODY's, attend's and the ring's arrays, a few words spare): each
    request's staged input vector is the largest of D, Hq Dh and F floats; attention's per-warp partial outputs
    grow with the query heads per KV head; with o_proj folded, a merged head's outputs too. A group's (more than
    two requests) staged vectors are dynamic (staged_bytes)."""
    rep, warps = heads // kv_heads, BLOCK // 32
    xs = max(D, heads * dh, F) if requests <= 2 else 0
    body = 4 * (requests * (xs + 3 * warps + kv_heads) + 1)
    attend = 4 * (rep * dh + 2 * dh + (rep + 1) * (dh // 32) + 2 * warps * rep + warps * rep * dh + 1)
    folded_head = 4 * (rep * dh + 1) if fold else 0
    ring = 8 * (KV_STAGES + 1)  # the ring's mbarriers, 8-byte aligned
    return body + attend + folded_head + ring + 4 + 64 + (32 * (requests - 1) if requests <= 2 else 0)


def fits(static: int, dh: int, kv_group: int = KV_GROUP, staged: int = 0, stages: int = KV_STAGES) -> bool:
    """A block's static shared memory within its limit, and beside it attention's ring (and a group's staged
    vectors) within the SM's."""
    return static <= SHARED_LIMIT and static + ring_bytes(dh, kv_group, stages) + staged <= SM_SHARED_LIMIT


def stages_that_fit(static: int, staged: int, dh: int, kv_group: int, requests: int) -> int:
    """The ring's stages beside `static` and `staged` bytes: KV_STAGES, fewer (down to two) where a group's staged
    vectors need the room; one request or a pair keeps KV_STAGES. 0: it does not fit."""
    fewest = 2 if requests > 2 else KV_STAGES
    return next((n for n in range(KV_STAGES, fewest - 1, -1) if fits(static, dh, kv_group, staged, n)), 0)


def group_stages(cfg, requests: int, kv_group: int = KV_GROUP) -> int:
    """stages_that_fit for a model config's shapes and `requests` a launch (eight of Qwen3-0.6B's vectors take
    96 KB: three stages)."""
    staged = staged_bytes(
        D=cfg.hidden_size, F=cfg.intermediate_size, dh=cfg.head_dim, heads=cfg.num_attention_heads, requests=requests
    )
    return stages_that_fit(shared_bytes(cfg, requests=requests), staged, cfg.head_dim, kv_group, requests)


def available(cfg, *, packed: bool, requests: int = 1) -> bool:
    """Where the persistent kernel runs: CUDA, head_dim 128 (the attention item's thread layout), bf16 weights,
    and shapes whose arrays fit one block's static shared memory, beside attention's ring (Qwen3-0.6B and
    -1.7B do; -4B and -8B do not, and keep the per-operation kernels). `requests`: 2 to MAX_GROUP requests'
    decodes in one launch: a pair's staged vectors take twice the static room (Qwen3-0.6B's fit, -1.7B's do
    not), a group's go beside the ring (group_stages)."""
    return BACKEND == "cuda" and cfg.head_dim == 128 and packed and group_stages(cfg, requests) > 0


def largest_group(cfg, *, packed: bool) -> int:
    """The most requests one launch decodes for a model config (`available` for every count from 2 up), or 1."""
    most = 1
    while most < MAX_GROUP and available(cfg, packed=packed, requests=most + 1):
        most += 1
    return most


def scratch_layout(*, D: int, heads: int, kv_heads: int, dh: int, F: int, splits: int, blocks: int) -> dict:
    """Name -> (offset, size) of the kernel's work arrays in its scratch output, as BODY lays them out (h_mid and
    head_parts used only with o_proj folded; the float4-read arrays first, at offsets that are multiples of 4)."""
    sizes = [
        ("h", D),
        ("qkv", (heads + 2 * kv_heads) * dh),
        ("o", heads * dh),
        ("act", F),
        ("h_mid", D),
        ("head_parts", kv_heads * D),
        ("m", heads * splits),
        ("l", heads * splits),
        ("partial_o", heads * splits * dh),
        ("block_best", blocks),
        ("block_index", blocks),
    ]
    layout, at = {}, 0
    for name, n in sizes:
        layout[name], at = (at, n), at + n
    return layout


def scratch_size(requests: int = 1, **shape) -> int:
    """The scratch output's floats: each request's scratch_layout(**shape), the next at a multiple of 4 floats."""
    per = sum(scratch_layout(**shape)["block_index"])  # the last array's end
    return requests * ((per + 3) // 4 * 4)


def folded(fold: bool | None = None) -> bool:
    """Whether o_proj runs folded into attention: `fold`, or PDLIB_PERSISTENT_FOLD=1 (off by default)."""
    if fold is not None:
        return fold
    return settings.get(FOLD_ENV) == "1"


def late_loads() -> bool:
    """PDLIB_PERSISTENT_LOAD=late: each weight phase requests its first weights after staging its vectors (module
    docstring), not before the barrier that precedes it (early, the default)."""
    return settings.get(LOAD_ENV) == "late"


def barriers_per_layer(fold: bool) -> int:
    """Grid barriers per layer: one after each phase (four with o_proj folded into attention, else five)."""
    return 4 if fold else 5


def launch(
    token,
    pos,
    dw: DecodeWeights,
    k_all,
    v_all,
    written,
    sync,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    poison: bool = False,
    blocks: int | None = None,
    stamps: bool = False,
    kv_group: int = KV_GROUP,
    fold: bool | None = None,
    others: tuple = (),
) -> list:
    """The kernel's outputs: [logits, tok_out (token, error flag, 0, 0), pos_out (pos + 1, 0, 0, 0), scratch
    (scratch_layout), stamps, the fence advanced]. k_all, v_all: the caches (L, Hkv, cap, Dh), written in
    place. `poison` fills the outputs with NaN first (a skipped element shows); `blocks` defaults to the SM
    count. `stamps` (a profile): block 0's globaltimer (ns) at a layer's STAMPS_PER_LAYER marks (profile_group.py),
    the LM head's start and end, the kernel's start, then the same as SM clock cycles; otherwise two unused words
    (16 bytes: not managed memory); with o_proj folded, its phase's marks are one instant.
    `kv_group`: keys per warp in each stage of attention's ring (KV_STAGES stages in flight). `fold`: o_proj
    folded into attention (`folded`). One sync buffer may see either; where it names a token mailbox area
    (new_sync), the last block also leaves the token there.
    `others`: more requests' (token, pos, k_all, v_all, written), up to MAX_GROUP in all, decoded in the same
    launch (never folded): each weight row is read once for all, and the barriers are paid once. Then logits is
    (R V,), tok_out and pos_out hold four words per request, scratch one scratch_layout per request, and a fence
    per request follows. A group (more than two) stages its vectors after the ring, with fewer stages where
    they need the room (group_stages)."""
    layers, _, cap, dh = k_all.shape
    V, D = dw.embed.shape
    F = dw.down.shape[2]
    requests = 1 + len(others)
    if not 1 <= requests <= MAX_GROUP:
        raise ValueError(f"{requests} requests: a launch decodes 1 to {MAX_GROUP}")
    if others and fold:
        raise ValueError("fold=True: o_proj folded into attention decodes one request a launch, not several")
    fold = folded(fold) and requests == 1  # PDLIB_PERSISTENT_FOLD=1 folds single launches only
    for other in others:
        if other[2].shape != k_all.shape or other[3].shape != v_all.shape:
            raise ValueError(f"a launch's caches must have one shape: {k_all.shape} and {other[2].shape}")
    static = static_shared_bytes(D=D, F=F, dh=dh, heads=heads, kv_heads=kv_heads, fold=fold, requests=requests)
    staged = staged_bytes(D=D, F=F, dh=dh, heads=heads, requests=requests)
    stages = stages_that_fit(static, staged, dh, kv_group, requests)
    if not stages:
        most = (SM_SHARED_LIMIT - static - staged) // ring_bytes(dh, 1)
        raise ValueError(
            f"kv_group={kv_group}: attention's ring would take {ring_bytes(dh, kv_group)} bytes of "
            f"shared memory beside {static} static{f' and {staged} staged' if staged else ''}; "
            f"1 to {max(most, 0)} keys per warp fit"
        )
    nb = blocks or sm_count()
    if not 1 <= nb <= MAX_BLOCKS:
        raise ValueError(f"blocks={nb}: the sync buffer has flags for 1 to {MAX_BLOCKS} blocks")
    splits = max(1, nb // (requests * kv_heads))
    size = scratch_size(requests, D=D, heads=heads, kv_heads=kv_heads, dh=dh, F=F, splits=splits, blocks=nb)
    dynamic = ring_bytes(dh, kv_group, stages) + staged
    return kernel(dh, kv_group, requests, dynamic)(
        inputs=[
            token,
            pos,
            dw.embed,
            dw.qkv,
            dw.o,
            dw.gate_up,
            dw.down,
            dw.lm_head,
            dw.in_norm,
            dw.post_norm,
            dw.q_norm,
            dw.k_norm,
            dw.norm,
            dw.inv_freq,
            sync,
            k_all,
            v_all,
            written,
            *(x for other in others for x in other),
        ],
        template=[
            ("D", D),
            ("HQ", heads),
            ("HKV", kv_heads),
            ("DH", dh),
            ("FF", F),
            ("NL", layers),
            ("V", V),
            ("CAP", cap),
            ("NB", nb),
            ("S", splits),
            ("BLOCK", BLOCK),
            ("EPS_BITS", float_bits(eps)),
            ("SCALE_BITS", float_bits(dh**-0.5)),
            ("SPIN", SPIN_CYCLES),
            ("STAMPS", stamps),
            ("SPL", STAMPS_PER_LAYER),
            ("KVG", kv_group),
            ("NST", stages),
            ("FOLD", fold),
            ("NR", requests),
            ("LATE", late_loads()),
        ],
        grid=(nb * BLOCK, 1, 1),
        threadgroup=(BLOCK, 1, 1),
        output_shapes=[
            (requests * V,),
            (4 * requests,),
            (4 * requests,),
            (size,),
            (2 * (STAMPS_PER_LAYER * layers + 3) if stamps else 2,),
            written.shape,
        ]
        + [written.shape] * (requests - 1),
        output_dtypes=[mx.float32, mx.uint32, mx.int32, mx.float32, mx.uint64] + [written.dtype] * requests,
        init_value=float("nan") if poison else None,
    )


def decode_persistent(token, pos, dw: DecodeWeights, k_all, v_all, written, sync, **kw):
    """-> (logits (V,), token (), pos + 1 (1,), [], [], the fence advanced): one launch (keywords as `launch`)."""
    logits, tok, next_pos, _, _, fence = launch(token, pos, dw, k_all, v_all, written, sync, **kw)
    return logits, tok[0], next_pos[:1], [], [], fence


def decode_persistent_group(reqs: list, dw: DecodeWeights, sync, **kw) -> list[tuple]:
    """Two to MAX_GROUP requests' decode steps in one launch, each request given as (token, pos, k_all, v_all,
    written) -> for each, decode_persistent's (logits (V,), token (), pos + 1 (1,), [], [], the fence advanced)
    (keywords as `launch`; `sync` is the group's own, naming every request's mailbox)."""
    token, pos, k_all, v_all, written = reqs[0]
    logits, tok, next_pos, _, _, *fences = launch(
        token, pos, dw, k_all, v_all, written, sync, others=tuple(map(tuple, reqs[1:])), **kw
    )
    V = dw.embed.shape[0]
    return [
        (logits[q * V : (q + 1) * V], tok[4 * q], next_pos[4 * q : 4 * q + 1], [], [], f) for q, f in enumerate(fences)
    ]


def decode_persistent_group_ops(reqs: list, dw: DecodeWeights, sync=None, **kw) -> list[tuple]:
    """The group's oracle: each request's decode_persistent_ops -> for each, (logits, token, pos + 1, ks, vs,
    fence) with the new rows (Hkv, 1, Dh) per layer for the caller to store."""
    return [
        decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw) for token, pos, k_all, v_all, written in reqs
    ]


def check_token(token: int) -> int:
    """A token id observed on the host; ERROR_TOKEN (a wait at a grid barrier timed out) raises."""
    if token == ERROR_TOKEN:
        raise RuntimeError(
            "the persistent decode kernel failed: a wait at a grid barrier timed out (its blocks "
            "were not all resident, or one stalled for ~1 s), or its input token or position was "
            "out of range; run with PDLIB_DECODE=kernels"
        )
    return token
