"""check-kernels' decode-rows rows run only on a GPU; here they run on the CPU with stand-ins, to show each row can
fail: with kernels that store nothing the outputs agree, so those rows pass, while the slot rows fail and the rest
of the pool is untouched; the engine's rows pass as they are and fail with a planted mix-up of rows."""

import pytest

import pdlib.engine.rows as R
import pdlib.tools.rows_check as RC
from pdlib.engine import kernels as K
from pdlib.engine.kernels.decode_rows import decode_rows_ops


def test_rows_that_store_nothing_fail_their_slot_rows(monkeypatch):
    def single(qkv, qn, kn, inv_freq, pos, kc, vc, written, **kw):
        return K.decode_attention_ops(qkv, qn, kn, inv_freq, pos, kc, vc, **kw)[0], written + 1

    def rows(qkv, meta, layer, qn, kn, inv_freq, pool_k, pool_v, after, poison=False, **kw):
        m, i = meta.tolist(), layer[0].item()
        caches = [(pool_k[s, i], pool_v[s, i]) for _, s, _ in m]
        o, _, _ = decode_rows_ops(qkv, [(r, p) for r, _, p in m], qn, kn, inv_freq, caches, **kw)
        return o, after[:4] + 1

    monkeypatch.setattr(K, "decode_attention_kernel", single)
    monkeypatch.setattr(RC, "decode_rows_kernel", rows)
    monkeypatch.setattr(RC, "check_engine_rows", lambda seed: [])  # below
    out = RC.check_decode_rows(0)
    verdict = {(r["kernel"], r["case"]): r["passed"] for r in out}
    assert len(verdict) == len(out) == 3 * 4 + 2 + 1
    for (kernel, case), passed in verdict.items():
        assert passed == (" slot" not in kernel), (kernel, case)
    assert all(r["max_abs"] == 0.0 for r in out if r["kernel"] == "decode_rows/o = single row")


@pytest.mark.parametrize("planted", [False, True])
def test_the_engine_rows_pass_and_fail_with_a_planted_mix_up(tiny, monkeypatch, planted):
    monkeypatch.setattr(RC, "synthetic_model", lambda *a, **k: tiny)  # the tiny model's rows run the twin
    if planted:
        real = R.decode_rows_ops
        mixed_up = lambda qkv, rows, *a, **k: real(qkv, [rows[-1], *rows[:-1]], *a, **k)  # noqa: E731
        monkeypatch.setattr(R, "decode_rows_ops", mixed_up)
    out = RC.check_engine_rows(0)
    # on the CPU neither the compiled rounds (no rows kernel) nor pairs or groups (no persistent kernel) qualify: they
    # run the step's launches, and fail alike
    assert [r["kernel"] for r in out] == [
        "engine rows/logits",
        "engine rows/kv",
        "engine rows compiled/logits",
        "engine rows compiled/kv",
        "engine rows pairs/logits",
        "engine rows pairs/kv",
        "engine rows groups/logits",
        "engine rows groups/kv",
    ]
    assert all(r["passed"] != planted for r in out)
