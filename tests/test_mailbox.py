"""The token mailbox (PDLIB_TOKEN_READ=mailbox, pdlib/engine/kernels/mailbox.py). On the CPU: a slot is read
once its sequence lands and never from an earlier position; the region's areas and the address halves the
kernel rebuilds; the engine, with a stand-in that keeps the kernel's contract (the ops twin's step, then the
token and its sequence into the area the sync buffer names), hands the executor the mailbox's tokens, and the
gate passes; a stand-in that writes a wrong token fails the gate's token check (so the gate sees what the
mailbox said), and one that writes nothing falls back to `.item()` after the timeout. The kernel's write
itself compiles for sm_90 (test_persistent_decode) and runs in check-kernels on a GPU."""

import mlx.core as mx
import numpy as np
import pytest

from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine import kernels as K
from pdlib.engine.kernels import mailbox as M
from pdlib.engine.kernels import persistent_decode as P
from pdlib.errors import InputError
from pdlib.experiment import Experiment
from pdlib.validate import ValidationError


def test_a_slot_is_read_once_its_sequence_lands_and_never_from_an_earlier_position():
    box = M.TokenMailbox(np.zeros(2 * M.SLOTS, np.uint32), area=1)
    assert box.wait(40, timeout_ns=1_000_000) is None   # nothing written
    box.words[2 * (40 % M.SLOTS): 2 * (40 % M.SLOTS) + 2] = [40 - M.SLOTS + 1, 7]   # the slot's last user's
    assert box.wait(40, timeout_ns=1_000_000) is None
    box.words[2 * (40 % M.SLOTS): 2 * (40 % M.SLOTS) + 2] = [41, 9]
    assert box.wait(40) == 9
    box.clear(40)
    assert box.wait(40, timeout_ns=1_000_000) is None and box.wait(41 + M.SLOTS, timeout_ns=1) is None
    with pytest.raises(ValueError, match="a mailbox area is 32 uint32 words"):
        M.TokenMailbox(np.zeros(8, np.uint32), area=1)


def test_the_region_hands_out_areas_and_the_kernel_can_rebuild_its_address():
    region = M.MailboxRegion(np.zeros(M.AREAS * 2 * M.SLOTS, np.uint32), address=0x7F3A_5C00_1000)
    t = dict(region.template())
    assert 0 <= t["MBOX_HI"] < 2 ** 31 and 0 <= t["MBOX_LO"] < 2 ** 31
    assert (t["MBOX_HI"] << 31) | t["MBOX_LO"] == region.address and t["MBOX_SLOTS"] == M.SLOTS
    boxes = [region.take() for _ in range(M.AREAS - 1)]   # area 0 stays unused: a plain sync buffer names it
    assert [b.area for b in boxes] == list(range(1, M.AREAS))
    boxes[2].words[:] = 5   # an area is its own slice of the region
    assert np.all(region.words[3 * 2 * M.SLOTS: 4 * 2 * M.SLOTS] == 5) and region.words[:2 * 3 * M.SLOTS].sum() == 0
    with pytest.raises(RuntimeError, match=f"more than {M.AREAS - 1} requests decode at once"):
        region.take()
    region.give_back(3)
    assert region.take().area == 3 and not region.free


def test_the_switch(monkeypatch, tiny):
    monkeypatch.setenv(M.ENV, "poll")
    with pytest.raises(InputError, match="PDLIB_TOKEN_READ must be item or mailbox, got 'poll'"):
        Engine(tiny, capacity=32)
    monkeypatch.setenv(M.ENV, "mailbox")
    with pytest.raises(InputError, match="PDLIB_TOKEN_READ=mailbox: only the persistent decode kernel writes a "
                                         "mailbox .* here decode is 'kernels'"):
        Engine(tiny, capacity=32, decode="kernels")


PROMPT, OUTPUTS, CHUNK = 40, 8, 16


@pytest.fixture
def mailbox_engine(monkeypatch):
    """The persistent path on the CPU with PDLIB_TOKEN_READ=mailbox: a region in plain memory, and a stand-in
    kernel: the ops twin's step (its new K/V rows stored by the cache), then, as the kernel's last block does,
    the token and its sequence into slot pos % SLOTS of the area the sync buffer names. `fault` changes what
    it writes. Returns the fault setter and the tokens each wait returned."""
    fault, seen = {"kind": None}, []
    monkeypatch.setenv(M.ENV, "mailbox")
    monkeypatch.setattr(M, "TIMEOUT_NS", 20_000_000)
    monkeypatch.setattr(P, "available", lambda cfg, **kw: True)
    monkeypatch.setattr(M.MailboxRegion, "pinned",
                        classmethod(lambda cls: cls(np.zeros(M.AREAS * 2 * M.SLOTS, np.uint32), address=1)))

    def kernel_like(token, pos, dw, k_all, v_all, written, sync, *, mailbox, **kw):
        out = K.decode_persistent_ops(token, pos, dw, k_all, v_all, written, **kw)
        area, p, tok = sync[P.SY_BOX].item(), pos.item(), out[1].item()
        assert mailbox is not None and area >= 1
        if fault["kind"] != "silent":
            slot = (area * M.SLOTS + p % M.SLOTS) * 2
            mailbox.words[slot: slot + 2] = [p + 1, tok + (fault["kind"] == "wrong token")]
        return (*out[:5], written + 1)
    monkeypatch.setattr(P, "decode_persistent", kernel_like)
    real_wait = M.TokenMailbox.wait
    monkeypatch.setattr(M.TokenMailbox, "wait", lambda self, pos, **kw: seen.append(real_wait(self, pos, **kw))
                        or seen[-1])
    return fault, seen


@pytest.mark.parametrize("pipeline", [False, True], ids=["observed", "pipelined"])
def test_the_executor_takes_the_mailboxs_tokens_and_the_gate_passes(tiny, mailbox_engine, pipeline):
    fault, seen = mailbox_engine
    params = RunParams(model="synthetic:tiny", prompt_tokens=PROMPT, output_tokens=OUTPUTS, chunk_size=CHUNK,
                       policies=("eager", "chunked"), logical_cache_reset=True, validation_checkpoint_every=4,
                       pipeline_decodes=pipeline)
    exp = Experiment(params, model=tiny)
    assert exp.engine.model.decode_mode == "persistent" and exp.engine.model.token_read == "mailbox"
    exp.validate(["eager", "chunked"])
    # every decode's token came from the mailbox (the prompt's first output is a prefill's: by .item())
    assert len(seen) == 2 * 2 * (OUTPUTS - 1) and None not in seen
    areas = {exp.engine.model.mailbox(exp.engine.requests[r].cache).area for r in ("A", "B")}
    assert len(areas) == 2 and 0 not in areas


def test_a_wrong_token_in_the_mailbox_fails_the_gate_and_a_missing_one_falls_back(tiny, mailbox_engine):
    fault, seen = mailbox_engine
    params = RunParams(model="synthetic:tiny", prompt_tokens=PROMPT, output_tokens=OUTPUTS, chunk_size=CHUNK,
                       policies=("chunked",), logical_cache_reset=True, validation_checkpoint_every=4)
    exp = Experiment(params, model=tiny)
    fault["kind"] = "wrong token"
    with pytest.raises(ValidationError, match="token check, request A"):
        exp.validate(["chunked"])
    fault["kind"], seen[:] = "silent", []
    exp.validate(["chunked"])   # nothing written: every wait timed out, and .item() read the right tokens
    assert seen and set(seen) == {None}


def test_outputs_without_a_mailbox_are_read_by_item(tiny):
    e = Engine(tiny, capacity=32, decode="kernels")
    e.add_request("A", list(range(3, 20)))
    e.reset("A", logical=True)
    first = e.prefill_chunk("A", 17)
    out = e.decode("A")
    assert first.mailbox is None and out.mailbox is None
    assert out.observe() == out.token.item() and isinstance(out.observe(), int)
    assert mx.array_equal(out.token, mx.argmax(out.logits)).item()


@pytest.mark.parametrize("fault", [None, "wrong token", "another area", "a failed step writes", "stale sequence"])
def test_the_mailbox_check_passes_the_kernels_contract_and_fails_each_fault(monkeypatch, fault):
    """check-kernels' persistent/mailbox row, with a stand-in step in plain memory: the contract passes; a wrong
    token, a write into another request's area, a write by a step that failed, or the sequence of the slot's
    earlier position each fail it."""
    from pdlib.kernel_check import check_persistent_mailbox
    monkeypatch.setattr(M.MailboxRegion, "pinned",
                        classmethod(lambda cls: cls(np.zeros(M.AREAS * 2 * M.SLOTS, np.uint32), address=1)))

    def tiny_step(sync, blocks, fold, pos=0, mailbox=None):
        failed, token = blocks > 2, 100 + pos
        area = sync[P.SY_BOX].item() + (fault == "another area")
        if not failed or fault == "a failed step writes":
            at = 2 * (area * M.SLOTS + pos % M.SLOTS)
            seq = pos + 1 - (M.SLOTS if fault == "stale sequence" and pos == 17 else 0)
            mailbox.words[at: at + 2] = [seq, token + (fault == "wrong token")]
        return mx.array(P.ERROR_TOKEN if failed else token, mx.uint32)
    monkeypatch.setattr(M, "TIMEOUT_NS", 1_000_000)
    (row,) = check_persistent_mailbox(tiny_step, too_many=4096)
    assert row["kernel"] == "persistent/mailbox" and row["passed"] == (fault is None)
