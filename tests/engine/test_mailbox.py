"""The token mailbox (PDLIB_TOKEN_READ=mailbox, pdlib/engine/kernels/mailbox.py). On the CPU: a slot is read
once its word carries the position, never from an earlier position; the region's areas and their addresses,
which a sync buffer carries to the kernel; the engine, with a stand-in that keeps the kernel's contract (the ops
twin's step, then position + 1 and the token into the slot of the area the sync buffer names), hands the
executor the mailbox's tokens and the gate passes; a stand-in that writes a wrong token fails the gate's token
check (the gate sees what the mailbox said), one that writes nothing is a clear error, and check-kernels'
mailbox row fails each fault planted in it. The kernel's write compiles for sm_90 (test_persistent_decode)
and runs in check-kernels on a GPU."""

import gc
import math
import weakref

import mlx.core as mx
import numpy as np
import pytest

from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine import kernels as K
from pdlib.engine.kernels import mailbox as M
from pdlib.engine.kernels import persistent_decode as P
from pdlib.errors import InputError
from pdlib.run.experiment import Experiment
from pdlib.run.trial import check_tokens, run_once
from pdlib.run.validate import ValidationError
from pdlib.scheduler import Batch, Decode, is_setup
from pdlib.tools.bench import bench_step

BASE = 0x7F3A_5C00_1000  # a device address, as cuMemHostGetDevicePointer gives one


def word(pos: int, token: int) -> int:
    return (pos + 1) << 32 | token


def fake_region() -> M.MailboxRegion:
    return M.MailboxRegion(np.zeros(M.AREAS * M.SLOTS, np.uint64), BASE)


def test_a_slot_is_read_once_its_word_carries_the_position_and_never_from_an_earlier_one():
    box = fake_region().take()
    assert box.wait(40, timeout_ns=1_000_000) is None  # nothing written
    box.words[40 % M.SLOTS] = word(40 - M.SLOTS, 7)  # the slot's last user's
    assert box.wait(40, timeout_ns=1_000_000) is None
    box.words[40 % M.SLOTS] = word(40, 0xFFFFFFFE)
    assert box.wait(40) == 0xFFFFFFFE
    box.clear(40)
    assert box.wait(40, timeout_ns=1_000_000) is None
    with pytest.raises(ValueError, match="a mailbox area is 16 uint64 words"):
        M.TokenMailbox(np.zeros(8, np.uint64), BASE)


def test_the_region_hands_out_areas_at_their_addresses_and_takes_them_back():
    region = fake_region()
    boxes = [region.take() for _ in range(M.AREAS)]
    assert [b.address for b in boxes] == [BASE + 8 * M.SLOTS * a for a in range(M.AREAS)]
    boxes[3].words[:] = 5  # an area is its own slice of the region
    assert np.all(region.words[3 * M.SLOTS : 4 * M.SLOTS] == 5) and region.words[: 3 * M.SLOTS].sum() == 0
    with pytest.raises(RuntimeError, match=f"more than {M.AREAS} requests decode at once"):
        region.take()
    region.give_back(boxes[3])
    again = region.take()
    assert again.address == boxes[3].address and not again.words.any() and not region.free


def test_a_full_region_first_collects_the_caches_only_a_cycle_still_holds():
    region, Cache = fake_region(), type("Cache", (), {})
    gc.disable()
    try:
        for _ in range(M.AREAS):
            cache = Cache()
            cache.me = cache  # gone only when the collector runs
            weakref.finalize(cache, region.give_back, region.take())
        del cache
        assert not region.free
        # every area came back (in the collector's order): the one taken is one of them
        assert region.take().address in {BASE + 8 * M.SLOTS * a for a in range(M.AREAS)}
        assert len(region.free) == M.AREAS - 1
    finally:
        gc.enable()


def test_a_sync_buffer_carries_its_areas_address_and_the_kernel_its_slots():
    sync = P.new_sync(BASE + 8 * M.SLOTS * 5)
    assert (sync[P.SY_BOX + 1].item() << 32 | sync[P.SY_BOX].item()) == BASE + 8 * M.SLOTS * 5
    assert not sync[2:].any().item() and not P.new_sync()[:2].any().item()
    assert f"constexpr int MBOX_SLOTS = {M.SLOTS};" in P.HEADER  # the kernel's slots are the host's


def test_the_switch(monkeypatch, tiny):
    monkeypatch.setenv(M.ENV, "poll")
    with pytest.raises(InputError, match="PDLIB_TOKEN_READ must be item or mailbox, got 'poll'"):
        Engine(tiny, capacity=32)
    monkeypatch.setenv(M.ENV, "mailbox")
    with pytest.raises(
        InputError,
        match="PDLIB_TOKEN_READ=mailbox: only the persistent decode kernel writes a "
        "mailbox .* here decode is 'kernels'",
    ):
        Engine(tiny, capacity=32, decode="kernels")
    assert Engine(tiny, capacity=32, decode="kernels", token_read="item").model.token_read == "item"  # disagg's
    monkeypatch.delenv(M.ENV)  # unset: the mailbox wherever the persistent kernel decodes, else .item()
    assert Engine(tiny, capacity=32, decode="kernels").model.token_read == "item"
    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(K, "mailbox_region", fake_region)
    assert Engine(tiny, capacity=32, decode="persistent").model.token_read == "mailbox"
    monkeypatch.setenv(M.ENV, "")  # empty: unset
    assert Engine(tiny, capacity=32, decode="persistent").model.token_read == "mailbox"
    monkeypatch.setenv(M.ENV, "item")
    assert Engine(tiny, capacity=32, decode="persistent").model.token_read == "item"


def test_memory_that_cannot_be_pinned_is_an_error_if_asked_for_and_item_if_only_the_default(monkeypatch, tiny, capsys):
    def unpinnable():
        raise RuntimeError(
            "PDLIB_TOKEN_READ=mailbox: cuMemHostAlloc failed (CUDA error 2); PDLIB_TOKEN_READ=item reads tokens by MLX"
        )

    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(K, "mailbox_region", unpinnable)
    monkeypatch.delenv(M.ENV, raising=False)
    assert Engine(tiny, capacity=32, decode="persistent").model.token_read == "item"
    assert "warning: PDLIB_TOKEN_READ=mailbox: cuMemHostAlloc failed" in capsys.readouterr().err
    monkeypatch.setenv(M.ENV, "mailbox")
    with pytest.raises(InputError, match="cuMemHostAlloc failed"):
        Engine(tiny, capacity=32, decode="persistent")


PROMPT, OUTPUTS, CHUNK = 40, 8, 16


@pytest.fixture
def mailbox_engine(monkeypatch):
    """The persistent path on the CPU with PDLIB_TOKEN_READ=mailbox: a region in plain memory, and a stand-in
    kernel: the ops twin's step (its new K/V rows stored by the cache), then, as the kernel's last block does,
    position + 1 and the token into slot pos % SLOTS of the area whose address the sync buffer holds (a pair
    launch: each request's step, into the area its words of the pair's sync buffer name). `fault`
    changes what it writes ("late": the word lands at the host's second look after the launch, or its
    fault["looks"]th, as a device still busy would leave it). Returns the fault setter, the tokens each wait
    returned or a look (`peek`) found, and the region."""
    fault, seen, region, late = {"kind": None}, [], fake_region(), []
    monkeypatch.setenv(M.ENV, "mailbox")
    monkeypatch.setattr(M, "TIMEOUT_NS", 20_000_000)
    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(K, "mailbox_region", lambda: region)

    def kernel_like(token, pos, dw, k_all, v_all, written, sync, q=0, **kw):
        """Request q's step; its area's address is in words SY_BOX + 2 q (low word first)."""
        out = K.decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw)
        box = P.SY_BOX + 2 * q
        address, p, tok = sync[box + 1].item() << 32 | sync[box].item(), pos.item(), out[1].item()
        if address and fault["kind"] != "silent":
            slot, value = (address - region.address) // 8 + p % M.SLOTS, word(p, tok + (fault["kind"] == "wrong"))
            if fault["kind"] == "late":
                late.append([fault.get("looks", 2), slot, value])
            else:
                region.words[slot] = value
        return (*out[:5], written + 1)

    def land():  # a late word lands at its second look
        for w in list(late):
            w[0] -= 1
            if w[0] == 0:
                region.words[w[1]] = w[2]
                late.remove(w)

    monkeypatch.setattr(P, "decode_persistent", kernel_like)
    monkeypatch.setattr(
        P,
        "decode_persistent_group",
        lambda reqs, dw, sync, **kw: [kernel_like(*r[:2], dw, *r[2:], sync, q=q, **kw) for q, r in enumerate(reqs)],
    )
    real_wait, real_peek = M.TokenMailbox.wait, M.TokenMailbox.peek

    def wait(self, pos, **kw):
        while late:
            land()
        seen.append(real_wait(self, pos, **kw))
        return seen[-1]

    def peek(self, pos):
        land()
        token = real_peek(self, pos)
        if token is not None:
            seen.append(token)
        return token

    monkeypatch.setattr(M.TokenMailbox, "wait", wait)
    monkeypatch.setattr(M.TokenMailbox, "peek", peek)
    return fault, seen, region


def experiment(tiny, policies, pipeline=False) -> Experiment:
    return Experiment(
        RunParams(
            model="synthetic:tiny",
            prompt_tokens=PROMPT,
            output_tokens=OUTPUTS,
            chunk_size=CHUNK,
            policies=policies,
            logical_cache_reset=True,
            validation_checkpoint_every=4,
            pipeline_decodes=pipeline,
        ),
        model=tiny,
    )


@pytest.mark.parametrize("pipeline", [False, True], ids=["observed", "pipelined"])
def test_the_executor_takes_the_mailboxs_tokens_and_the_gate_passes(tiny, mailbox_engine, pipeline):
    fault, seen, region = mailbox_engine
    exp = experiment(tiny, ("eager", "chunked"), pipeline)
    assert exp.engine.model.decode_mode == "persistent" and exp.engine.model.token_read == "mailbox"
    exp.validate(["eager", "chunked"])
    # every decode's token came from the mailbox (the prompt's first output is a prefill's: by .item())
    assert len(seen) == 2 * 2 * (OUTPUTS - 1) and None not in seen
    boxes = [exp.engine.model.mailbox(exp.engine.requests[r].cache) for r in ("A", "B")]
    assert len({b.address for b in boxes}) == 2 and len(region.free) == M.AREAS - 2


@pytest.mark.parametrize("pipeline", [False, True], ids=["observed", "pipelined"])
def test_mixeds_two_decodes_a_step_come_from_one_launch_and_both_mailboxes(tiny, mailbox_engine, pipeline, monkeypatch):
    """mixed's steps of both decodes (after B's prompt) run as one pair launch each: the gate passes with every
    such token read from its own request's area, and a wrong token there fails it."""
    fault, seen, region = mailbox_engine
    launches, pair = [], P.decode_persistent_group
    monkeypatch.setattr(P, "decode_persistent_group", lambda *a, **kw: launches.append(1) or pair(*a, **kw))
    exp = experiment(tiny, ("mixed",), pipeline)
    assert exp.engine.settings["pair_decode"] == "pair"
    pairs = [s for s in exp.plan("mixed") if isinstance(s, Batch) and all(isinstance(w, Decode) for w in s.work)]
    assert len(pairs) >= 2
    exp.validate(["mixed"])
    assert len(launches) == len(pairs) and len(seen) >= 2 * len(pairs) and None not in seen
    fault["kind"] = "wrong"
    with pytest.raises(ValidationError, match="token check"):
        exp.validate(["mixed"])


@pytest.mark.parametrize("pipeline", [False, True], ids=["observed", "pipelined-polled"])
def test_a_wrong_token_fails_the_gate_and_a_missing_one_is_an_error(tiny, mailbox_engine, pipeline):
    fault, seen, region = mailbox_engine
    exp = experiment(tiny, ("chunked",), pipeline)
    fault["kind"] = "wrong"
    with pytest.raises(ValidationError, match="token check, request A"):
        exp.validate(["chunked"])
    fault["kind"] = "silent"
    with pytest.raises(RuntimeError, match=r"position \d+'s token \(\d+\) never reached the mailbox"):
        exp.validate(["chunked"])


@pytest.mark.parametrize("looks", [2, 9], ids=["found-between-layers", "found-after"])
def test_a_chunk_is_issued_while_the_decodes_ahead_are_polled(tiny, mailbox_engine, looks):
    """Pipelined and polled (RunParams.poll_during_chunks): a prompt chunk after a decode is issued before that
    decode's token is on the host, and the host finds the token between the chunk's layers when it lands
    there (the tiny model's chunk has two: its last layer is pruned), or else waits for it once the chunk is
    issued. Either way the gate passes, a trial's tokens are the validated ones and the hooks see the plan's
    steps in order. Without polling, every chunk starts after the decode before it ended."""
    fault, seen, region = mailbox_engine
    fault.update(kind="late", looks=looks)
    exp = experiment(tiny, ("chunked",), pipeline=True)
    assert exp.params.poll_during_chunks
    tokens = exp.validate()["chunked"].tokens
    for poll in (False, True):
        run = run_once(exp.engine, "chunked", steps=exp.walk("chunked"), logical_reset=True, pipeline=True, poll=poll)
        check_tokens(run, tokens, what=f"poll={poll}")
        steps = [e for e in run.events if e["kind"] != "reset"]
        assert [e["kind"] for e in steps] == [
            type(w).__name__.lower() for s in exp.plan("chunked") if not is_setup(s) for w in s.work
        ]
        pairs = [(a, b) for a, b in zip(steps, steps[1:]) if a["kind"] == "decode" and b["kind"] == "prefill"]
        assert len(pairs) == math.ceil(PROMPT / CHUNK)  # A's decode before each chunk
        for a, b in pairs:
            if not poll:
                assert a["t_end_ns"] <= b["t_start_ns"]
            elif looks == 2:  # found at the chunk's second layer boundary, before it was issued
                assert b["t_start_ns"] < a["t_end_ns"] < b["t_issued_ns"]
            else:
                assert b["t_start_ns"] < b["t_issued_ns"] <= a["t_end_ns"]
            assert a["t_issued_ns"] <= a["t_wait_ns"] <= a["t_end_ns"]


def test_bench_step_reads_the_persistent_kernels_tokens_from_the_mailbox_and_the_per_op_kernels_by_item(
    tiny, mailbox_engine
):
    fault, seen, region = mailbox_engine
    result = bench_step(
        tiny,
        peers=False,
        log=lambda *a: None,
        contexts=(32,),
        tokens=3,
        warmup=1,
        prefill_tokens=40,
        chunk=16,
        repeats=1,
    )
    engines = result["engines"]
    assert engines["pdlib"]["token_read"] == "mailbox" and engines["pdlib-kernels"]["token_read"] == "item"
    assert engines["pdlib"]["pair_decode"] == "pair" and "pair_step_pipelined_ms_median" in engines["pdlib"]
    assert "pair_step_ms_median" not in engines["pdlib-kernels"]
    # the observed then the pipelined decodes, then the pair steps' (two tokens each), all from the mailbox
    assert len(seen) >= 2 * (1 + 3) + 2 * 2 * (1 + 3) and None not in seen


def test_an_area_goes_back_when_its_cache_goes(tiny, mailbox_engine):
    fault, seen, region = mailbox_engine
    e = Engine(tiny, capacity=32)
    e.add_request("A", list(range(3, 20)))
    e.reset("A", logical=True)
    e.prefill_chunk("A", 17)
    assert isinstance(e.decode("A").observe(), int) and len(region.free) == M.AREAS - 1
    e.add_request("A", list(range(3, 20)))  # the request's cache replaced: the old one's area returns
    gc.collect()
    assert len(region.free) == M.AREAS


def test_outputs_without_a_mailbox_are_read_by_item(tiny):
    e = Engine(tiny, capacity=32, decode="kernels")
    e.add_request("A", list(range(3, 20)))
    e.reset("A", logical=True)
    first = e.prefill_chunk("A", 17)
    out = e.decode("A")
    assert first.mailbox is None and out.mailbox is None
    assert out.observe() == out.token.item() and isinstance(out.observe(), int)
    assert mx.array_equal(out.token, mx.argmax(out.logits)).item()


def with_an_earlier_users_words(region):
    """The region as check-kernels' later rows find it: an area given back keeps its last words (`give_back`
    does not clear an area; `take` does)."""
    box = region.take()
    box.words[:2] = [word(0, 7), word(1, 8)]
    region.give_back(box)
    return region


@pytest.mark.parametrize("fault", [None, "wrong token", "another area", "a failed step writes", "stale position"])
def test_the_mailbox_check_passes_the_kernels_contract_and_fails_each_fault(monkeypatch, fault):
    """check-kernels' persistent/mailbox row, with a stand-in step in plain memory: the contract passes; a wrong
    token, a write into another request's area, a write by a step that failed, or the word of the slot's
    earlier position each fail it."""
    from pdlib.tools.persistent_check import check_persistent_mailbox

    region = with_an_earlier_users_words(fake_region())
    monkeypatch.setattr(M, "region", lambda: region)

    def tiny_step(sync, blocks, fold, pos=0):
        failed, token = blocks > 2, 100 + pos
        address = sync[P.SY_BOX + 1].item() << 32 | sync[P.SY_BOX].item()
        at = (address - region.address) // 8 + pos % M.SLOTS + (M.SLOTS if fault == "another area" else 0)
        if not failed or fault == "a failed step writes":
            at_pos = pos - M.SLOTS if fault == "stale position" and pos == 17 else pos
            region.words[at] = word(at_pos, token + (fault == "wrong token"))
        return mx.array(P.ERROR_TOKEN if failed else token, mx.uint32)

    (row,) = check_persistent_mailbox(tiny_step, too_many=4096)
    assert row["kernel"] == "persistent/mailbox" and row["passed"] == (fault is None)
    assert len(region.free) == M.AREAS  # the check gives its areas back


@pytest.mark.parametrize("fault", [None, "wrong token", "both areas", "swapped areas", "stale position"])
def test_the_pairs_mailbox_check_passes_the_kernels_contract_and_fails_each_fault(monkeypatch, fault):
    """check-kernels' pair mailbox row, with a stand-in pair step in plain memory: the contract (each request's
    word in its own area, named by its words of the pair's sync buffer) passes; a wrong token, a token written
    into both areas, the two areas swapped, or the word of the slot's earlier position each fail it."""
    from pdlib.tools.persistent_check import check_persistent_pair_mailbox

    region = with_an_earlier_users_words(fake_region())
    monkeypatch.setattr(M, "region", lambda: region)

    def tiny_pair(sync, blocks, positions):
        areas = [(sync[P.SY_BOX + 2 * q + 1].item() << 32 | sync[P.SY_BOX + 2 * q].item()) for q in range(2)]
        if fault == "swapped areas":
            areas.reverse()
        tokens = [100 + 2 * pos + q for q, pos in enumerate(positions)]
        for q, (pos, token) in enumerate(zip(positions, tokens)):
            at_pos = pos - M.SLOTS if fault == "stale position" and pos == 21 else pos
            for area in areas if fault == "both areas" else [areas[q]]:
                region.words[(area - region.address) // 8 + pos % M.SLOTS] = word(
                    at_pos, token + (fault == "wrong token")
                )
        return [mx.array(t, mx.uint32) for t in tokens]

    (row,) = check_persistent_pair_mailbox(tiny_pair)
    assert row["kernel"] == "persistent/mailbox" and row["passed"] == (fault is None)
    assert len(region.free) == M.AREAS
