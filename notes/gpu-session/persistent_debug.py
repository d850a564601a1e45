"""If check-kernels' persistent rows fail: which phase is wrong. One layer at Qwen3-0.6B shapes, random weights;
the kernel's scratch holds that layer's q|k|v, attention output, SwiGLU activation and final h (and, with o_proj
folded, h after attention), each compared with the ops twin's (max |error|, where, all finite). Prints one
JSON line per position. PDLIB_PERSISTENT_FOLD=1 debugs the folded variant.

    python3 notes/gpu-session/persistent_debug.py [blocks]
"""

import json
import sys

import mlx.core as mx

from pdlib.engine import kernels as K
from pdlib.engine.kernels import persistent_decode as P
from pdlib.kernel_check import _random_decode_weights

D, Hq, Hkv, Dh, F, V, cap, eps = 1024, 16, 8, 128, 3072, 151936, 640, 1e-6
nb = int(sys.argv[1]) if len(sys.argv) > 1 else P.sm_count()
S = max(1, nb // Hkv)
for pos in (0, 1, 200, 639):
    mx.random.seed(pos)
    dw = _random_decode_weights(1, D, Hq, Hkv, Dh, F, V)
    live = (mx.arange(cap) < pos)[None, :, None]
    kc, vc = (mx.where(live, mx.random.normal((Hkv, cap, Dh)), 1e4) for _ in range(2))
    k_all, v_all = kc[None] + 0.0, vc[None] + 0.0  # the kernel's (L, Hkv, cap, Dh) caches, written in place
    token, p = mx.array(pos * 37 % V, mx.uint32), mx.array([pos], mx.int32)
    # the twin, phase by phase
    h0 = dw.embed[token].reshape(D)
    qkv = K.gemv_ops(h0, dw.qkv[0], norm=dw.in_norm[0], eps=eps)
    o, k, v = K.decode_attention_ops(qkv, dw.q_norm[0], dw.k_norm[0], dw.inv_freq, p, kc, vc, heads=Hq,
                                     kv_heads=Hkv, eps=eps)
    h1 = K.gemv_ops(o, dw.o[0], residual=h0)
    act = K.gemv_ops(h1, dw.gate_up[0], norm=dw.post_norm[0], eps=eps, swiglu=True)
    h2 = K.gemv_ops(act, dw.down[0], residual=h1)
    logits = K.gemv_ops(h2, dw.lm_head, norm=dw.norm, eps=eps)
    mx.eval(dw, kc, vc, k_all, v_all, qkv, o, h1, act, h2, logits)
    sync = P.new_sync()
    got_logits, tok_out, pos_out, scratch, _, fence = P.launch(token, p, dw, k_all, v_all, K.new_fence(), sync,
                                                               heads=Hq, kv_heads=Hkv, eps=eps, blocks=nb, poison=True)
    mx.eval(got_logits, tok_out, pos_out, scratch, fence)
    at = P.scratch_layout(D=D, heads=Hq, kv_heads=Hkv, dh=Dh, F=F, splits=S, blocks=nb)
    part = {name: scratch[a: a + n] for name, (a, n) in at.items()}
    row = {"pos": pos, "blocks": nb, "tok_out": tok_out.tolist(), "want_token": mx.argmax(logits).item(),
           "pos_out": pos_out.tolist(), "fence": fence.tolist(), "fold": P.folded(),
           "sync": {"epoch": sync[P.SY_EPOCH].item(), "error": sync[P.SY_ERR].item(),
                    "head counts": sync[P.SY_HEAD: P.SY_HEAD + Hkv].tolist()}}

    def err(name, a, b):
        d = mx.abs(a - b)
        row[name] = [float(mx.max(d).item()), int(mx.argmax(d).item()), bool(mx.all(mx.isfinite(a)).item())]

    for name, want in (("qkv", qkv), ("o", o), ("act", act), ("h", h2)) + ((("h_mid", h1),) if P.folded() else ()):
        err(name, part[name], want)
    err("logits", got_logits, logits)
    k_after, v_after = K.read_after(k_all, fence)[0], K.read_after(v_all, fence)[0]
    err("k slot", k_after[:, pos].reshape(-1), k.reshape(-1))
    err("v slot", v_after[:, pos].reshape(-1), v.reshape(-1))
    print(json.dumps(row), flush=True)
