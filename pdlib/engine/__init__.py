"""The model under test: pdlib's own Qwen3 with per-request KV caches.

    engine = Engine(load_model("synthetic:tiny"), capacity=prompt + outputs)
    engine.add_request("A", prompt_ids)
    engine.reset("A", logical=True)
    out = engine.prefill_chunk("A", 64)     # None until the chunk that finishes the prompt
    out = engine.decode("A")                # Output(logits, token); token stays on the device
    outs = engine.batch([("A", None), ("B", 64)])   # one step: A's decode beside B's next chunk
    out.observe()                           # the host observes it (int)

A request may also wait for a cache (`add_request(..., cached=False)`): `attach` gives it one, `detach` (or
`detach_all`) takes it back for the next (kept allocated, so a serving loop that reuses caches allocates none), and
`reserve(k)` makes k caches ahead of time; `spare` says how many more requests can hold one at once.

The engine keeps each request's next input token itself, so a step needs only the request's name. A request's
progress has one owner, its cache (`length`); how much of the prompt is prefilled follows from it.
On a GPU the kernels write new K/V slots into the cache arrays in place; `kv()` reads them through the
cache's write fence (kernels/fence.py), so a read is ordered after the writes it should see. Evaluate what
`kv()` returned, and the request's last step, before resetting the request, whose next writes reuse those
slots: the prefill's attention reads the cache in place (kernels/flash_prefill.py), ordered after the writes
through the fence but not before the next ones.
"""

import gc
from dataclasses import dataclass

import mlx.core as mx

from pdlib import settings
from pdlib.engine.cache import KVCache
from pdlib.engine.kernels.mailbox import TokenMailbox
from pdlib.engine.kernels.persistent_decode import ERROR_TOKEN
from pdlib.engine.kernels.persistent_decode import check_token as check_token  # re-exported
from pdlib.engine.model import Qwen3, Segment, drain
from pdlib.engine.round import CompiledRounds
from pdlib.weights import LoadedModel


@dataclass
class Output:
    logits: mx.array  # (V,) FP32, on the device
    token: mx.array  # greedy pick, scalar uint32, on the device
    mailbox: TokenMailbox | None = None  # where the kernel also leaves the token (PDLIB_TOKEN_READ=mailbox)
    position: int = 0  # the token's slot there: its position
    picks: mx.array | None = None  # a step's picks for all its emitting rows, started with the step: this is [row]
    row: int = 0

    def observe(self) -> int:
        """The token id on the host: polled from the mailbox where the kernel writes one, else by MLX's
        `.item()`. A step that fails writes none: past the wait's timeout, `.item()` says ERROR_TOKEN; any other
        token there means the mailbox missed one, which is an error of its own."""
        if self.mailbox is None:
            return self.token.item()
        token = self.mailbox.wait(self.position)
        if token is None and (token := self.token.item()) != ERROR_TOKEN:
            raise RuntimeError(
                f"PDLIB_TOKEN_READ=mailbox: position {self.position}'s token ({token}) never reached "
                f"the mailbox; PDLIB_TOKEN_READ=item reads tokens by MLX"
            )
        return token

    def peek(self) -> int | None:
        """The token id if it is on the host already (in the mailbox), else None, without waiting; always None
        without a mailbox (`.item()` cannot look without waiting)."""
        return None if self.mailbox is None else self.mailbox.peek(self.position)


def observe_all(outs: list["Output | None"], seen=None) -> list[int | None]:
    """Every output's token on the host (None for a part without one), in order: one in a mailbox polled there;
    the rows of one step's picks (Engine._finish) in one read of that array, which went out with its step (a
    read of anything new would queue behind the steps issued since); any other by `.item()`. `seen(i, token)`
    is called as each is seen (a serving loop stamps it then)."""
    tokens, read = [None] * len(outs), {}
    for i, o in enumerate(outs):
        if o is None:
            continue
        if o.mailbox is None and o.picks is not None:
            if id(o.picks) not in read:
                read[id(o.picks)] = o.picks.tolist()
            tokens[i] = read[id(o.picks)][o.row]
        else:
            tokens[i] = o.observe()
        if seen:
            seen(i, tokens[i])
    return tokens


@dataclass
class Request:
    prompt: mx.array  # (P,) int32
    cache: KVCache | None  # None: waiting for one (Engine.attach)
    next_token: mx.array | None = None

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.length

    @property
    def prefilled(self) -> int:
        """Prompt tokens in the cache (decodes only start once the whole prompt is in)."""
        return min(self.length, self.prompt.size)


# PDLIB_DECODE_ROUND: a step of three or more decodes (a serving policy's decode round) as one decode launch
# each (`each`), or as one ragged engine step (`step`: the prefill path's matmuls, every weight read once for
# all rows; their attention one launch a layer where their caches share a pool, engine/rows.py), or as that
# step compiled into one function a round replays (`compiled`, engine/round.py: where the rows kernel runs,
# else `step`). Two decodes share the persistent pair launch either way, and so do a round's rows two by two
# (the odd one alone) up to PDLIB_ROUND_PAIRS rows: where few rows decode, pair launches take less time than
# one step over all of them, whose launches the host must build and MLX encode.
ROUND_ENV = "PDLIB_DECODE_ROUND"
PAIRS_ENV, GROUP_ENV = "PDLIB_ROUND_PAIRS", "PDLIB_ROUND_GROUP"  # rounds as launches of up to GROUP decodes

# PDLIB_STEP_DISPATCH: how a step with a prompt chunk reaches the device. `layers` (the default) starts each
# layer as soon as it is built (as prefill_stages does), so the device need not wait for the host to build a
# 28-layer step; `step` builds every layer's graph, then starts it. The same arithmetic either way.
DISPATCH_ENV = "PDLIB_STEP_DISPATCH"


class Engine:
    def __init__(
        self,
        model: LoadedModel,
        *,
        capacity: int,
        lossless_decode_weights: bool = True,
        prune_final_layer: bool = True,
        compile_steps: bool = True,
        decode: str | None = None,
        token_read: str | None = None,
        slots: int | None = None,
    ):
        self.dispatch = settings.get(DISPATCH_ENV)  # a bad value is refused here
        self.decode_round = settings.get(ROUND_ENV)
        self.round_pairs, self.round_group = settings.get(PAIRS_ENV), settings.get(GROUP_ENV)
        self.round_gemm = settings.get("PDLIB_ROUND_GEMM")  # read by kernels/gemm.py; a bad value is refused here
        self.model = Qwen3(
            model,
            lossless_decode_weights=lossless_decode_weights,
            compile_steps=compile_steps,
            decode=decode,
            token_read=token_read,
        )
        self.capacity = capacity
        self.prune_final_layer = prune_final_layer
        self.requests: dict[str, Request] = {}
        self.idle: list[KVCache] = []  # allocated caches that no request holds, for the next attach
        # slots: the requests' caches in one pool of that many (a step's decode rows then attend in one launch a
        # layer: engine/rows.py); None: a cache of its own each
        self.pool = None if slots is None else self.model.new_pool(capacity, slots)
        self.rounds = CompiledRounds(self.model)  # PDLIB_DECODE_ROUND=compiled's (engine/round.py)

    def add_request(self, name: str, prompt_ids, *, cached: bool = True) -> None:
        """Add the request with a cache of its own (`attach`), or, `cached=False`, holding none until `attach`."""
        ids, vocab = [int(i) for i in prompt_ids], self.model.cfg.vocab_size
        if ids and not 0 <= min(ids) <= max(ids) < vocab:  # an id past the table reads past the embedding
            bad = next(i for i in ids if not 0 <= i < vocab)
            raise ValueError(f"prompt token id {bad} is outside the model's vocabulary [0, {vocab})")
        prompt = mx.array(ids, dtype=mx.int32)
        if prompt.size >= self.capacity:
            raise ValueError(f"prompt of {prompt.size} tokens leaves no room in a cache of {self.capacity}")
        self.remove_request(name)
        self.requests[name] = Request(prompt, None)
        if cached:
            self.attach(name)

    def _new_cache(self) -> KVCache:
        return self.model.new_cache(self.capacity) if self.pool is None else self.pool.cache()

    @property
    def spare(self) -> int | None:
        """How many more requests can hold a cache at once: the idle caches and the pool's free slots (None: no
        pool, so no bound here)."""
        return None if self.pool is None else len(self.idle) + len(self.pool.free)

    def reserve(self, k: int) -> None:
        """Make caches until k are idle (pool slots taken now, not when a request is attached)."""
        while len(self.idle) < k:
            self.idle.append(self._new_cache())

    def attach(self, name: str) -> None:
        """Give the request a cache, empty: an idle one, else a new one; a RuntimeError where the pool has no
        slot left."""
        r = self.requests[name]
        if r.cache is not None:
            raise ValueError(f"request {name} holds a cache already")
        r.cache = self.idle.pop(0) if self.idle else self._new_cache()
        r.cache.reset(logical=True)
        r.next_token = None

    def detach(self, name: str) -> None:
        """Take the request's cache back, idle for the next attach; its last step's writes stay ordered before the
        next owner's by the cache's fence."""
        r = self.requests[name]
        if r.cache is None:
            raise ValueError(f"request {name} holds no cache")
        self.idle.append(r.cache)
        r.cache, r.next_token = None, None

    def detach_all(self, names) -> None:
        """Each of `names` that holds a cache gives it back (idle); each is then as if just added without one."""
        for name in names:
            if self.requests[name].cache is not None:
                self.detach(name)

    def remove_request(self, name: str) -> None:
        """Forget the request (if there is one), its pool slot given back."""
        r = self.requests.pop(name, None)
        if r is not None and r.cache is not None:
            self._give_back(r.cache)

    def _give_back(self, cache: KVCache) -> None:
        if self.pool is not None:
            self.pool.give_back(cache)

    def clear_requests(self, *, keep_caches: bool = False) -> None:
        """Forget every request; their caches and the idle ones go back to the pool, or stay idle (`keep_caches`:
        for the next requests, allocated)."""
        if keep_caches:
            self.detach_all(list(self.requests))
        for name in list(self.requests):
            self.remove_request(name)
        if not keep_caches:
            for cache in self.idle:
                self._give_back(cache)
            self.idle = []

    def release(self) -> None:
        """Give the device memory of every cache back (the requests', the pool's, the compiled rounds' traces) to
        another system run in the same process, e.g. mlx-lm after the policies; a request added after has a cache of
        its own, outside any pool."""
        self.clear_requests()
        self.pool = None
        self.rounds = CompiledRounds(self.model)
        gc.collect()  # what sits in reference cycles (the old rounds' compiled method) goes now, not mid-run
        mx.clear_cache()

    def _held(self, name: str) -> Request:
        """The request, which must hold a cache for a step."""
        r = self.requests[name]
        if r.cache is None:
            raise ValueError(f"request {name} holds no cache (Engine.attach gives it one)")
        return r

    def reset(self, name: str, *, logical: bool) -> None:
        """Forget the request's progress; logical keeps the cache allocation and only rewinds its length."""
        r = self.requests[name]
        if r.cache is not None:
            r.cache.reset(logical=logical)
        r.next_token = None

    def prefill_chunk(self, name: str, n: int) -> Output | None:
        return self.batch([(name, n)])[0]

    def batch(self, parts: list[tuple[str, int | None]], *, between=None) -> list[Output | None]:
        """One engine step over several requests: (name, n) prefills the next n prompt tokens, (name, None)
        decodes one token; at most one part per request. With a prompt chunk, the rows share the weight reads
        (Qwen3.step). Decodes alone run on the decode path instead (a ragged step of two decode rows is far
        slower than the decode kernels): two of them in one persistent launch where the model pairs decodes
        (Qwen3.pairs), a round of up to PDLIB_ROUND_PAIRS two by two; more back to back, or as one ragged step
        (PDLIB_DECODE_ROUND=step: the weights read once for all rows). Returns each part's output: a decode's, or
        the first output of the chunk that finishes a prompt. `between()` is called after each layer of a step
        with a prompt chunk is started (layer dispatch; never with PDLIB_STEP_DISPATCH=step): the executor looks
        there for the tokens of the step ahead."""
        if len({name for name, _ in parts}) < len(parts):
            raise ValueError(f"a step holds at most one part per request, got {parts}")
        if all(n is None for _, n in parts):
            if self.model.pairs and 2 <= len(parts) <= max(2, self.round_pairs):
                return self._decode_pairs([name for name, _ in parts])
            if len(parts) < 3 or self.decode_round == "each":
                return [self.decode(name) for name, _ in parts]
        segments = [self._segment(name, n) for name, n in parts]
        reqs = [self.requests[name] for name, _ in parts]
        if self.decode_round == "compiled" and (logits := self.rounds(segments)) is not None:
            return self._finish(reqs, logits)
        if self.dispatch == "step":
            return self._finish(reqs, self.model.step(segments, prune=self.prune_final_layer))
        layers = self._layer_by_layer(reqs, segments)  # each layer starts while the host builds the next
        if between is None:
            return drain(layers)
        while True:
            try:
                next(layers)
            except StopIteration as done:
                return done.value
            between()

    @property
    def settings(self) -> dict[str, str]:
        """What this engine runs as, by its switches' names: the decode path, the prefill's arithmetic, the step
        dispatch, how tokens are read and whether a step's two decodes share a launch (reports and bench-step
        record it)."""
        m = self.model
        return {
            "decode": m.decode_mode,
            **m.prefill_arithmetic,
            "step_dispatch": self.dispatch,
            "token_read": m.token_read,
            "pair_decode": "pair" if m.pairs else "each",
            "decode_round": self.decode_round,
            "round_pairs": self.round_pairs if m.pairs else None,
            "round_group": self.launch_group if m.pairs else None,
            "round_gemm": self.round_gemm,
        }

    def prefill_stages(self, name: str, n: int):
        """prefill_chunk(name, n) one layer at a time: each next() builds one more layer, starts it on the
        device and yields its arrays (evaluating them waits for that layer); the generator returns the Output
        (or None). A long prompt dispatched as one graph holds the host while MLX keeps at most 10 command
        buffers in flight; a layer at a time, it does not, and other work (A's decodes,
        overlap) can be issued between the layers."""
        return (yield from self._layer_by_layer([self.requests[name]], [self._segment(name, n)]))[0]

    def _layer_by_layer(self, reqs: list[Request], segments: list[Segment]):
        """The step over `segments`, each layer started on the device as soon as it is built; yields its arrays
        (to wait on: the layer is done when they are) and returns the step's outputs."""
        stages = self.model.stages(segments, prune=self.prune_final_layer)
        while True:
            try:
                arrays = next(stages)
            except StopIteration as done:
                return self._finish(reqs, done.value)
            mx.async_eval(arrays)
            yield arrays

    def _segment(self, name: str, n: int | None) -> Segment:
        r = self._held(name)
        if n is None:
            if r.next_token is None:
                raise ValueError(f"decode of {name} before its prompt is prefilled")
            return Segment(r.cache, r.next_token.reshape(1), start=r.cache.length, emits=True)
        start, stop = r.prefilled, r.prefilled + n
        if n < 1 or stop > r.prompt.size:
            raise ValueError(f"prefill of {n} tokens at {start} overruns {name}'s {r.prompt.size}-token prompt")
        return Segment(r.cache, r.prompt[start:stop], start=r.cache.length, emits=stop == r.prompt.size)

    def _finish(self, reqs: list[Request], logits: list) -> list[Output | None]:
        emitting = [l for l in logits if l is not None]
        if len(emitting) < 2:  # each emitting part starts itself (_emit)
            outs = [None if l is None else self._emit(r, l) for r, l in zip(reqs, logits)]
            unstarted = [r for r, o in zip(reqs, outs) if o is None]
        else:  # one argmax and one start for every row, not one each (a serving round of many)
            picks = mx.argmax(mx.stack(emitting), axis=-1)
            rows = iter(range(len(emitting)))
            outs = [
                None if l is None else self._emit(r, l, picks[next(rows)], start=False) for r, l in zip(reqs, logits)
            ]
            for k, o in enumerate(o for o in outs if o is not None):
                o.picks, o.row = picks, k
            mx.async_eval(picks, [(o.token, o.logits) for o in outs if o is not None])
            unstarted = reqs
        mx.async_eval([r.cache.lazy() for r in unstarted])  # MLX is lazy: start the cache writes now
        return outs

    def decode(self, name: str) -> Output:
        r = self._held(name)
        if r.next_token is None:
            raise ValueError(f"decode of {name} before its prompt is prefilled")
        position = r.cache.length
        logits, token = self.model.decode(r.cache, r.next_token)
        out = self._emit(r, logits, token)
        out.mailbox, out.position = self.model.mailbox(r.cache), position
        return out

    @property
    def launch_group(self) -> int:
        """The most decodes of a round in one launch: PDLIB_ROUND_GROUP, held to what the kernel fits, at least 2."""
        return max(2, min(self.round_group, self.model.group))

    def _decode_pairs(self, names: list[str]) -> list[Output]:
        """A round's decodes in launches of up to PDLIB_ROUND_GROUP (2: pairs; at most what the kernel fits), in
        order, a last one left alone decoded alone: each one's Output, in order."""
        g, outs = self.launch_group, []
        for i in range(0, len(names), g):
            some = names[i : i + g]
            outs += self._decode_pair(some) if len(some) > 1 else [self.decode(some[0])]
        return outs

    def warm_groups(self, most: int) -> list[int]:
        """Each launch size past a pair a decode round can take here (3 up to PDLIB_ROUND_GROUP, what the kernel
        fits, the rounds PDLIB_ROUND_PAIRS sends that way and `most` caches at once), its kernel built now by one
        launch of that many two-token requests, which then give their caches back: no timed round pays a build.
        The sizes launched (none where launches of several do not run)."""
        m = self.model
        top = min(self.launch_group, self.round_pairs, most) if m.pairs else 0
        names = [f"warm-group-{i}" for i in range(top)] if top >= 3 else []
        for name in names:
            self.add_request(name, [1, 2])
            self.prefill_chunk(name, 2)
        for n in range(3, len(names) + 1):
            observe_all(self.batch([(name, None) for name in names[:n]]))
        for name in names:
            self.remove_request(name)
        return list(range(3, len(names) + 1))

    def _decode_pair(self, names: list[str]) -> list[Output]:
        """Two or more requests' decodes as one launch (Qwen3.decode_group): each one's Output, as `decode`
        gives it."""
        reqs = [self._held(name) for name in names]
        for name, r in zip(names, reqs):
            if r.next_token is None:
                raise ValueError(f"decode of {name} before its prompt is prefilled")
        positions = [r.cache.length for r in reqs]
        pairs = self.model.decode_group([r.cache for r in reqs], [r.next_token for r in reqs])
        outs = [self._emit(r, logits, token) for r, (logits, token) in zip(reqs, pairs)]
        for out, r, position in zip(outs, reqs, positions):
            out.mailbox, out.position = self.model.mailbox(r.cache), position
        return outs

    def install(self, name: str, kv: mx.array, logits: mx.array, token: mx.array) -> Output:
        """A prompt prefilled elsewhere (disagg): kv (L, 2, Hkv, T, Dh) goes into the request's cache after
        what it holds; logits and token are the prompt's first output, as its last chunk yields it."""
        r = self._held(name)
        r.cache.install([kv[i, 0] for i in range(kv.shape[0])], [kv[i, 1] for i in range(kv.shape[0])])
        return self._emit(r, logits, token)

    @staticmethod
    def _emit(r: Request, logits: mx.array, token: mx.array | None = None, *, start: bool = True) -> Output:
        token = mx.argmax(logits) if token is None else token
        r.next_token = token
        if start:  # else the caller starts it with the rest of its step
            mx.async_eval(token, logits, r.cache.k, r.cache.v, r.cache.written)
        return Output(logits, token)

    def kv(self, name: str, start: int, stop: int, layers: range | None = None) -> mx.array:
        """K and V over positions [start, stop) of every layer, or of `layers`: (layers, 2, Hkv, stop - start, Dh)."""
        c = self._held(name).cache
        return mx.stack([mx.stack(c.read(i, start, stop)) for i in (range(len(c.k)) if layers is None else layers)])
