"""check-kernels' decode-rows rows run only on a GPU; here they run on the CPU with stand-in kernels (the twins,
which store nothing), to show each row can fail: the outputs agree, so those rows pass, and since nothing was
stored in the pool the slot rows fail while the rest of the pool is untouched."""

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
    out = RC.check_decode_rows(0)
    verdict = {(r["kernel"], r["case"]): r["passed"] for r in out}
    assert len(verdict) == len(out) == 3 * 4 + 2 + 1
    for (kernel, case), passed in verdict.items():
        assert passed == (" slot" not in kernel), (kernel, case)
    assert all(r["max_abs"] == 0.0 for r in out if r["kernel"] == "decode_rows/o = single row")
