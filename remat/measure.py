"""Measure a step's peak as the budget contract counts it (defined in ``remat.passes.program.measure``,
which the profiler uses for CPU workspace)."""

from remat.passes.program.measure import budget_peak, cpu_step_peak, cuda_step_peak, held_bytes, step_peak, tensor_bytes

__all__ = ["budget_peak", "cpu_step_peak", "cuda_step_peak", "held_bytes", "step_peak", "tensor_bytes"]
