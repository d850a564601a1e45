"""Which backend runs, and the one place kernels are built: once, at import, for that backend only."""

import mlx.core as mx

BACKEND = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"


def kernel_or_none(name: str, inputs: list[str], outputs: list[str], *, cuda_source: str, metal_source: str,
                   header: str = ""):
    """The backend's custom kernel, or None on the CPU (where the ops twin runs)."""
    if BACKEND == "cuda":
        return mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs, source=cuda_source,
                                   header=header)
    if BACKEND == "metal":
        return mx.fast.metal_kernel(name=name, input_names=inputs, output_names=outputs, source=metal_source,
                                    header=header)
    return None


def float_bits(x: float) -> int:
    """An FP32 value as the int32 of its bits: kernels take it as a template constant and rebuild it exactly
    (no tiny scalar array for the kernel to read: MLX keeps those in managed memory)."""
    import struct
    return struct.unpack("<i", struct.pack("<f", x))[0]
