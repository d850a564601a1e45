"""The fixed tolerance every check uses, |x - ref| <= 1e-3 + 1e-3 |ref|: the gate (run/validate.py) and
check-kernels (tools/kernel_check.py) both measure errors here.

    stats = tolerance_stats(x, ref)     # (3, n): max |x-ref|, max ratio to the tolerance, count out, per row
"""

import mlx.core as mx

ATOL = RTOL = 1e-3


def elementwise(x: mx.array, ref: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """|x-ref|, its ratio to the tolerance atol + rtol|ref|, and whether it is out of tolerance, per element.
    NaN anywhere is infinitely bad; a non-finite reference passes only where x equals it."""
    err = mx.abs(x - ref)
    err = mx.where(mx.isnan(err), mx.inf, err)
    tol = ATOL + RTOL * mx.abs(ref)
    finite = mx.isfinite(ref)
    bad = mx.where(finite, err > tol, x != ref)
    ratio = mx.where(finite, err / tol, mx.where(x == ref, 0.0, mx.inf))
    return err, ratio, bad


def tolerance_stats(x: mx.array, ref: mx.array) -> mx.array:
    """Per leading index (layer): [max |x-ref|, max |x-ref| / (atol + rtol|ref|), count out of tolerance],
    shape (3, n)."""
    n = x.shape[0]
    err, ratio, bad = elementwise(x.reshape(n, -1), ref.reshape(n, -1))
    return mx.stack([mx.max(err, axis=1), mx.max(ratio, axis=1), mx.sum(bad, axis=1).astype(mx.float32)])
