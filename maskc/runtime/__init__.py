"""The runtime: compiled kernels on a GPU, and the CPU path. kernels (the compile cache, per-mask device
state, operands, argument packing and launches of the forward and backward), launch (packed launches),
tma (tensor maps), autotune, cache (the disk cache), handles and torch_ops (autograd and torch.compile),
reference and cpu_check (the float64 CPU path).
"""
from .kernels import AttentionInputError, attention, attention_backward, binary_name, disk_cache, load_kernel

__all__ = ["attention", "attention_backward", "binary_name", "disk_cache", "load_kernel",
           "AttentionInputError"]
