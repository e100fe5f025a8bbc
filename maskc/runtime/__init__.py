"""The runtime: compiled kernels on a GPU, and the CPU path. kernels (the entry points: plans, argument
packing and launches of the forward and backward), loader (compiled kernels, in memory and in the disk cache
of cache), state (per-mask device state, device properties), operands (input checks, outputs), launch
(packed launches), tma (tensor maps), autotune, handles and torch_ops (autograd and torch.compile),
reference and cpu_check (the float64 CPU path).
"""
from .kernels import attention, attention_backward
from .loader import binary_name, disk_cache, load_kernel
from .operands import AttentionInputError

__all__ = ["attention", "attention_backward", "binary_name", "disk_cache", "load_kernel",
           "AttentionInputError"]
