"""Tile schedules: the forward kernel's (block_m, block_n, num_warps, engine) and the backward kernels' tiles,
per head dim, dtype and GPU generation.

Pure functions of the problem's static shape; the runtime calls :func:`choose_tiles` and passes the result
to ``bound.kernel_spec(...)`` and ``bound.descriptor(...)``. The choices are bounded by the register file
(255 registers per thread, no spills: see bench/NOTES.md for ptxas's report of each) and by shared memory
(Q tile + two K and two V buffers per CTA).

Forward engines (kernel_ir.ENGINES): ``mma`` (mma.sync, attention_fwd.cu.j2) everywhere, and for head dims 64,
128 and 256 on compute capability 9.0 ``wgmma_tma`` (warp-specialized, copy engine, persistent:
attention_fwd_tma.cu.j2). ``engine=`` (maskc.options.Options.engine) overrides the choice (benchmarks,
bisecting a fault).
The cp.async ``wgmma`` kernel that wgmma_tma superseded was retired on 2026-12-04 (bench/NOTES.md, runs 27-29).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from maskc.kernel_ir import BACKWARD_ENGINES, DQ_REDUCTIONS, ENGINES


class Tiles(NamedTuple):
    """The forward kernel's shape: query rows per CTA, keys per step, warps, and the engine."""

    block_m: int
    block_n: int
    num_warps: int
    engine: str = "mma"


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
# wgmma_tma, as FA4's Hopper forward sizes its tiles (flash_attn/cute/interface.py, _tile_size_fwd_sm90):
#   D=64:  three consumer warpgroups over 192 query rows, 128 keys (more softmax in flight per product);
#   D=128: two warpgroups, 128 x 128 (Q, O staging and two K/V stages: 192 KB);
#   D=256: two warpgroups, 128 x 80: Q 64 KB (O staged in it) + two stages of K and V at 40 KB each = 224 KB,
#          which leaves room for one interval-table region only; masks with more get 64 keys (_tma_block_n).
_TMA_TILES = {
    64: (192, 128, 12),
    128: (128, 128, 8),
    256: (128, 80, 8),
}
HOPPER = (9, 0)
# Targets kernels are built for, by compute capability: sm_80 (A100), sm_86 (RTX 30xx, A40), sm_89 (L40S,
# RTX 40xx), sm_90a (H100, H200: wgmma and setmaxnreg need the "a" target), sm_100a (B200), sm_120a (RTX 50xx).
# A "compute_XX" target builds PTX that the driver compiles for the GPU at hand (a portable fallback).
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a")
# The compute capabilities, 8.0 and newer, that NVRTC 13.0 (pyproject's pin) builds PTX for: its
# nvrtcGetSupportedArchs, which tests/test_schedule.py compares with the NVRTC at hand. A compute_XY target
# outside them (compute_99) would pass every check here and fail only inside NVRTC.
PTX_CAPABILITIES = ((8, 0), (8, 6), (8, 7), (8, 8), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))


def arch_for(capability: tuple[int, int]) -> str:
    """The build target of a GPU of compute ``capability``: the newest of ARCHES it can run (a GPU runs
    machine code of its own major version and a minor at most its own; "a" targets only on their GPU)."""
    major, minor = capability
    exact = {(9, 0): "sm_90a", (10, 0): "sm_100a", (12, 0): "sm_120a"}.get((major, minor))
    if exact:
        return exact
    fits = [a for a in ARCHES if not a.endswith("a") and capability_of(a)[0] == major and capability_of(a)[1] <= minor]
    if fits:
        return fits[-1]
    if major < 8:
        raise ValueError(f"compute capability {major}.{minor}: maskc's kernels need 8.0 or newer (bf16 mma.sync)")
    return f"compute_{major}{minor}"   # PTX: the driver compiles it for this GPU


def capability_of(arch: str) -> tuple[int, int]:
    """The compute capability a target is for: sm_86 -> (8, 6), sm_90a -> (9, 0), compute_80 -> (8, 0)."""
    digits = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)a?", arch)
    if digits is None:
        raise ValueError(f"target {arch!r} is not sm_XY[a] or compute_XY")
    return int(digits.group(1)), int(digits.group(2))


def check_target(arch: object) -> tuple[int, int]:
    """The compute capability of a target a user names (``Options.arch``, ``MASKC_ARCH``): one of ARCHES, or
    compute_XY for a compute capability of PTX_CAPABILITIES (PTX, as arch_for picks for a GPU without one of
    ARCHES). Any other (sm_99, sm_90 for sm_90a, compute_75, compute_99) is a ValueError listing them, before
    NVRTC is asked."""
    if isinstance(arch, str) and (arch in ARCHES or re.fullmatch(r"compute_\d\d+", arch)):
        if arch in ARCHES or capability_of(arch) in PTX_CAPABILITIES:
            return capability_of(arch)
    ptx = ", ".join(f"compute_{major}{minor}" for major, minor in PTX_CAPABILITIES)
    raise ValueError(f"target {arch!r} unsupported: maskc builds for {', '.join(ARCHES)}, or compute_XY for PTX the "
                     f"driver compiles ({ptx}: the capabilities NVRTC builds PTX for; compute_80 runs on every GPU "
                     "maskc supports)")


# The engine the schedule picks on Hopper: the one measured fastest on the H200 among those whose GPU tests
# passed there (bench/NOTES.md). A kernel that has not run on the GPU is never the default. wgmma_tma: the
# fastest engine in run 20 on every example mask at 1K, 4K and 32K but two (sliding_window at 1K and clear
# at 4K, where wgmma led).
DEFAULT_HOPPER_ENGINE = "wgmma_tma"
SUPPORTED_DTYPES = ("bf16", "fp16")


def _lookup(table: dict, head_dim: int, dtype: str, what: str) -> tuple[int, int, int]:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype!r} unsupported (supported: {', '.join(SUPPORTED_DTYPES)})")
    try:
        return table[head_dim]
    except KeyError:
        raise ValueError(f"{what}head dim {head_dim} unsupported (supported: {', '.join(map(str, table))})") from None


def forward_candidates(head_dim: int, dtype: str, capability: tuple[int, int] = HOPPER) -> tuple[Tiles, ...]:
    """Every forward configuration worth timing on a GPU of compute ``capability`` (maskc.runtime.autotune), the
    mma.sync kernel first: the others are checked against it."""
    candidates = [choose_tiles(head_dim, dtype, capability, engine="mma")]
    if tuple(capability) == HOPPER and head_dim in _TMA_TILES:
        block_m, block_n, warps = _TMA_TILES[head_dim]
        candidates += [Tiles(block_m, n, warps, "wgmma_tma") for n in sorted({block_n, 64}, reverse=True)]
    return tuple(candidates)


def choose_tiles(head_dim: int, dtype: str, capability: tuple[int, int] = HOPPER,
                 engine: str | None = None, table_regions: int = 0) -> Tiles:
    """The forward kernel's tiles for a GPU of compute ``capability``; ``engine`` picks one instead of the
    fastest that applies; ``table_regions``: the regions of the mask's interval table (shared memory it
    takes). ValueError for an unsupported head dim, dtype or engine."""
    if engine not in (None, *ENGINES):
        also = (" (a dK/dV engine: the backward's, --backward on the command line)"
                if engine in BACKWARD_ENGINES else "")
        raise ValueError(f"engine {engine!r} is not a forward engine{also}; the forward's: {', '.join(ENGINES)}")
    hopper = tuple(capability) == HOPPER
    if engine == "wgmma_tma" and not (hopper and head_dim in _TMA_TILES):
        dims = ", ".join(map(str, _TMA_TILES))
        raise ValueError(f"the {engine} engine needs compute capability 9.0 and head dim {dims} "
                         f"(got {capability[0]}.{capability[1]}, head dim {head_dim})")
    if engine is None and hopper and head_dim in _TMA_TILES:
        engine = DEFAULT_HOPPER_ENGINE
    if engine == "wgmma_tma":
        block_m, block_n, warps = _lookup(_TMA_TILES, head_dim, dtype, "")
        return Tiles(block_m, _tma_block_n(head_dim, block_n, table_regions), warps, engine)
    return Tiles(*_lookup(_TILES, head_dim, dtype, ""), "mma")


def _tma_block_n(head_dim: int, block_n: int, table_regions: int) -> int:
    """wgmma_tma's keys per step: the table's, or 64 where the interval table (8 bytes per region and query
    row) would not fit beside the tiles (D=256: one region fits at 80 keys)."""
    return 64 if head_dim == 256 and table_regions > 1 else block_n


# Backward: (block_m, block_n, dq_block_n). The dK/dV kernel runs block_n / 16 warps (8), each owning 16 keys,
# with dK and dV in registers (64 fp32 each at D=128); block_m queries per step. The deterministic dQ
# kernel runs block_m / 16 warps (4) over keys dq_block_n at a time. Every dK/dV engine uses these tiles at
# head dims 64 and 128: `mma` (mma.sync) and, on Hopper, `wgmma` and `wgmma_tma` (8 consumer warps in two
# warpgroups of 64 keys; block_m 64 is the N of their S^T products and the M of their dQ product).
# D=256 is Hopper's wgmma_tma alone: 64 keys x 256 columns of dK and dV are 256 fp32 per thread of a
# warpgroup, so its two warpgroups share the block's 64 keys and split the head dim (64 + 64 fp32 each) and
# each step's queries (BackwardSpec.split_head_dim; FA3 and FA4 split hdim 256 the same way).
_BACKWARD_TILES = {
    64: (64, 128, 64),
    128: (64, 128, 64),
    256: (64, 64, 32),
}
_HOPPER_ONLY_BACKWARD_DIMS = (256,)
# The dK/dV engine the schedule picks on Hopper: wgmma_tma (warp-specialized), measured faster than wgmma on
# every mask at 32K (runs 43-46, bench/NOTES.md: causal backward 542 against 450 TF/s, document 459 against
# 365), its GPU tests all passed (runs 44-46); wgmma had replaced mma (run 24: 354 against 249).
DEFAULT_HOPPER_BACKWARD_ENGINE = "wgmma_tma"


class BackwardTiles(NamedTuple):
    """The backward kernels' shapes and the dK/dV kernel's engine."""

    block_m: int
    block_n: int
    dq_block_n: int
    engine: str = "mma"


def choose_backward_tiles(head_dim: int, dtype: str, capability: tuple[int, int] = HOPPER,
                          engine: str | None = None) -> BackwardTiles:
    """The backward kernels' tiles and dK/dV engine for a GPU of compute ``capability``; ``engine`` picks one
    instead of the default. ValueError where there is none."""
    if engine not in (None, *BACKWARD_ENGINES):
        raise ValueError(f"backward engine {engine!r} unknown (engines: {', '.join(BACKWARD_ENGINES)})")
    tiles = _lookup(_BACKWARD_TILES, head_dim, dtype, "backward: ")
    if head_dim in _HOPPER_ONLY_BACKWARD_DIMS:
        if tuple(capability) != HOPPER or engine not in (None, "wgmma_tma"):
            raise ValueError(f"backward at head dim {head_dim} needs compute capability 9.0 and the wgmma_tma "
                             f"engine (got {capability[0]}.{capability[1]}, engine {engine or 'mma'})")
    if engine in ("wgmma", "wgmma_tma") and tuple(capability) != HOPPER:
        raise ValueError(f"the {engine} backward engine needs compute capability 9.0 "
                         f"(got {capability[0]}.{capability[1]})")
    if engine is None:
        engine = DEFAULT_HOPPER_BACKWARD_ENGINE if tuple(capability) == HOPPER else "mma"
    return BackwardTiles(*tiles, engine)


# The wgmma dK/dV kernel's way of adding dQ to the fp32 buffer (kernel_ir.DQ_REDUCTIONS): bulk_tile, measured
# faster than red2 side by side (run 26: causal 32K 409 against 386 TF/s, hstu 357 against 327).
DEFAULT_DQ_REDUCTION = "bulk_tile"


def choose_dq_reduction(engine: str, requested: str | None = None, head_dim: int = 128) -> str:
    """The dQ reduction of a dK/dV kernel on ``engine``: ``requested`` (experiments: Options.dq_reduction),
    else the default; the mma kernel has only red2, the warp-specialized one bulk_tile (its dQ warp reduces
    whole tiles) except at head dim 256, where the staging tiles (64 KB) do not fit beside two stages of Q
    and dO: red2 there."""
    if engine == "mma":
        return "red2"
    if engine == "wgmma_tma":
        return "red2" if head_dim in _HOPPER_ONLY_BACKWARD_DIMS else "bulk_tile"
    chosen = requested or DEFAULT_DQ_REDUCTION
    if chosen not in DQ_REDUCTIONS:
        raise ValueError(f"dQ reduction {chosen!r} unknown (known: {', '.join(DQ_REDUCTIONS)})")
    return chosen
