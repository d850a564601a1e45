"""Matrix-vector products for decode, reading losslessly bf16-packed weights with FP32 accumulation (half the
bytes of the memory-bound step, bit-identical results), plus the plain FP32 `linear` that prefill uses.

One kernel covers every decode matvec, with optional fusions chosen by template flags:
  NORM     RMSNorm the input first (x * rsqrt(mean(x^2) + eps) * nw): q|k|v, gate|up and the LM head
  RESIDUAL add a residual vector to the output: o_proj and down_proj
  SWIGLU   rows r and N + r give silu(gate) * up for output r: gate|up
A warp owns ROWS rows per pass, each lane holding its 16-byte (8 bf16) pieces of them in registers; the loads
of the first pass are issued before the block stages the (normed) input vector in shared memory, and each
pass issues the next one's before reducing its own.
"""

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND, float_bits, kernel_or_none, source
from pdlib.engine.kernels.rmsnorm import rms_norm


def launch_shape(n_rows: int) -> tuple[int, int]:
    """Threads per block and rows per warp. Any value is correct; these were the fastest of a sweep, which
    found little between shapes."""
    return (256, 2) if n_rows <= 4096 else (256, 1)


def linear(x: mx.array, w: mx.array) -> mx.array:
    """x: (..., D) @ w.T with w: (N, D), FP32 (prefill)."""
    return x @ w.T


def gemv_ops(
    x: mx.array,
    w: mx.array,
    *,
    norm: mx.array | None = None,
    eps: float = 0.0,
    residual: mx.array | None = None,
    swiglu: bool = False,
    poison: bool = False,
) -> mx.array:
    """The oracle: x (K,) FP32, w (N or 2N, K) bf16 or FP32 -> (N,) FP32. `poison` is the kernel's and does
    nothing here (every element is computed)."""
    if norm is not None:
        x = rms_norm(x, norm, eps=eps)
    y = w.astype(mx.float32) @ x
    if swiglu:
        g, u = mx.split(y, 2)
        y = g * mx.sigmoid(g) * u
    if residual is not None:
        y = residual + y
    return y


SOURCE = source("gemv.cu")

_kernel = kernel_or_none("pdlib_gemv_bf16", ["x", "w", "nw", "res"], ["out"], source=SOURCE)
_ONE = mx.zeros((4,), mx.float32)  # stands in for an unused input


def gemv_kernel(
    x: mx.array,
    w: mx.array,
    *,
    norm: mx.array | None = None,
    eps: float = 0.0,
    residual: mx.array | None = None,
    swiglu: bool = False,
    poison: bool = False,
) -> mx.array:
    """`poison` fills the output with NaN before the kernel runs, so a test sees any element it skipped."""
    K = x.shape[0]
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    block, rows = launch_shape(N)
    blocks = min(-(-N // (block // 32 * rows)), 4096)
    (out,) = _kernel(
        inputs=[x, w, _ONE if norm is None else norm, _ONE if residual is None else residual],
        template=[
            ("K", K),
            ("N", N),
            ("BLOCK", block),
            ("ROWS", rows),
            ("EPS_BITS", float_bits(eps)),
            ("NORM", norm is not None),
            ("RESIDUAL", residual is not None),
            ("SWIGLU", swiglu),
        ],
        grid=(blocks * block, 1, 1),
        threadgroup=(block, 1, 1),
        output_shapes=[(N,)],
        output_dtypes=[mx.float32],
        init_value=float("nan") if poison else None,
    )
    return out


def gemv(x, w, **kw):
    """The kernel on a GPU backend (bf16 weights, K a multiple of 8); the ops twin otherwise."""
    if _kernel is not None and w.dtype == mx.bfloat16 and x.shape[0] % 8 == 0:
        return gemv_kernel(x, w, **kw)
    return gemv_ops(x, w, **kw)


__all__ = ["BACKEND", "gemv", "gemv_kernel", "gemv_ops", "linear"]
