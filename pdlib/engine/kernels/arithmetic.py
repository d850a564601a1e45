"""What a ragged step's prefill arithmetic runs as here, by the switches' names (reports record it)."""

from pdlib.engine.kernels.flash_prefill import arithmetic as flash_arithmetic
from pdlib.engine.kernels.flash_prefill import enabled as flash_enabled
from pdlib.engine.kernels.gemm import bf16_weights, choice, enabled, sum_choice
from pdlib.engine.kernels.qk_rope import enabled as qk_rope_enabled


def prefill_arithmetic(head_dim: int, *, packed: bool) -> dict[str, str]:
    """The prefill's matmuls and attention: tf32x2 and bf16x3 need the bf16 copies (`packed`), and without them
    run as tf32x3; off CUDA both are MLX's FP32 ops. With the matmul kernels, how a K split is summed (and the
    residual add or SwiGLU after it); with flash, whether a chunk's q/k norms, RoPE and K/V store are one kernel."""
    gemm = choice() if enabled() else "fp32"
    if gemm != "fp32" and bf16_weights() and not packed:
        gemm = "tf32x3"
    attention = "flash" if flash_arithmetic() == "fp32" else "flash-tf32x3"
    if not flash_enabled(head_dim):
        attention = "ops"
    out = {"prefill_matmuls": gemm, "prefill_attention": attention}
    if gemm != "fp32":
        out["prefill_split_sums"] = sum_choice()
    if attention != "ops":
        out["prefill_qk"] = "kernel" if qk_rope_enabled(head_dim) else "ops"
    return out
