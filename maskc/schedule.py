"""Tile schedules: the forward kernel's (block_m, block_n, num_warps) and the backward kernels' tiles, per head
dim and dtype.

Pure functions of the problem's static shape; the runtime calls :func:`choose_tiles` and passes the result
to ``bound.kernel_spec(...)`` and ``bound.descriptor(...)``. The choices are bounded by the register file
(255 registers per thread, no spills: see bench/NOTES.md for ptxas's report of each) and by shared memory
(Q tile + two K and two V buffers per CTA).
"""
from __future__ import annotations

# (head_dim) -> (block_m, block_n, num_warps). Each warp owns block_m / num_warps query rows (16 or 32).
#   D=64:  16 rows per warp, Q fragments in registers; 154 registers (causal), 48 KB smem.
#   D=128: 32 rows per warp, Q re-read from shared memory; 255 registers with 32-128 B of spills (v4: 84 B
#          for most examples, hstu 128, clear 32; bench/NOTES.md), 96 KB smem + the interval table, 2 CTAs/SM.
#          Measured on the H200 at 32K causal (run 7): 12.75 ms (345 TF/s) against 17.46 ms for 128x64x8.
#   D=256: 16 rows per warp, Q re-read from shared memory; 247 registers, 160 KB smem.
_TILES = {
    64: (128, 64, 8),
    128: (128, 64, 4),
    256: (64, 32, 4),
}
SUPPORTED_DTYPES = ("bf16", "fp16")


def _lookup(table: dict, head_dim: int, dtype: str, what: str) -> tuple[int, int, int]:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype!r} unsupported (supported: {', '.join(SUPPORTED_DTYPES)})")
    try:
        return table[head_dim]
    except KeyError:
        raise ValueError(f"{what}head dim {head_dim} unsupported (supported: {', '.join(map(str, table))})") from None


def choose_tiles(head_dim: int, dtype: str) -> tuple[int, int, int]:
    """(block_m, block_n, num_warps) for the forward kernel; ValueError for an unsupported head dim or dtype."""
    return _lookup(_TILES, head_dim, dtype, "")


# Backward: (block_m, block_n, dq_block_n). The dK/dV kernel runs block_n / 16 warps (8), each owning 16 keys,
# with dK and dV in registers (64 fp32 each at D=128); block_m queries per step. The deterministic dQ
# kernel runs block_m / 16 warps (4) over keys dq_block_n at a time. Head dims 64 and 128.
_BACKWARD_TILES = {
    64: (64, 128, 64),
    128: (64, 128, 64),
}


def choose_backward_tiles(head_dim: int, dtype: str) -> tuple[int, int, int]:
    """(block_m, block_n, dq_block_n) for the backward kernels; ValueError where there is none."""
    return _lookup(_BACKWARD_TILES, head_dim, dtype, "backward: ")
