"""Stack the decode step's new K and V rows of every layer in one launch each pair.

    k_new, v_new = stack_pair(ks, vs)     # ks, vs: L arrays of S floats -> two (L, S) arrays

`mx.stack` copies each input with its own kernel: 2 x 28 launches per decode step at 0.6B shapes, as many
as the model's attention kernels. This is one kernel (the source is generated for L inputs per side).
"""

from functools import cache

import mlx.core as mx

from pdlib.engine.kernels.backend import BACKEND, kernel_or_none


def stack_pair_ops(ks: list[mx.array], vs: list[mx.array]) -> tuple[mx.array, mx.array]:
    return mx.stack([k.reshape(-1) for k in ks]), mx.stack([v.reshape(-1) for v in vs])


@cache
def _kernel(n: int):
    index = {"cuda": "const int i = blockIdx.x * blockDim.x + threadIdx.x;",
             "metal": "const int i = thread_position_in_grid.x;"}
    copies = "".join(f"    ko[{j} * S + i] = k{j}[i]; vo[{j} * S + i] = v{j}[i];\n" for j in range(n))
    sources = {b: f"    {index[b]}\n    if (i >= S) return;\n{copies}" for b in index}
    return kernel_or_none(f"pdlib_stack_pair_{n}", [f"k{j}" for j in range(n)] + [f"v{j}" for j in range(n)],
                          ["ko", "vo"], cuda_source=sources["cuda"], metal_source=sources["metal"])


def stack_pair_kernel(ks: list[mx.array], vs: list[mx.array], *, poison: bool = False):
    n, S = len(ks), ks[0].size
    threads = min(256, S)
    ko, vo = _kernel(n)(inputs=[*ks, *vs], template=[("S", S)], grid=(-(-S // threads) * threads, 1, 1),
                        threadgroup=(threads, 1, 1), output_shapes=[(n, S), (n, S)],
                        output_dtypes=[mx.float32, mx.float32], init_value=float("nan") if poison else None)
    return ko, vo


def stack_pair(ks: list[mx.array], vs: list[mx.array]) -> tuple[mx.array, mx.array]:
    """The kernel on a GPU backend; `mx.stack` on the CPU."""
    if BACKEND == "cpu":
        return stack_pair_ops(ks, vs)
    return stack_pair_kernel(ks, vs)
