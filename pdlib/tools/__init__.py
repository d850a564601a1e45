"""Measuring the engine on a device: bench-step with its peers, check-kernels, profile-step."""
