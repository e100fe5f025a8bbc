"""The stages after tile classification: the packed descriptor, the kernel's schedule and its source.

These are the run-time half of maskc's IR (the compile-time half, source to canonical regions, is in
:mod:`maskc.ir`). Every array is int32 and C-contiguous so it can be uploaded to the GPU as is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2
TILE_KIND_NAMES = {EMPTY: "EMPTY", PARTIAL: "PARTIAL", FULL: "FULL"}


@dataclass(frozen=True, eq=False)
class Descriptor:
    """The compact, kernel-ready description of a bound mask, for one tile shape.

    Notation: ``B`` batch elements, ``QT = ceil(seq_len / block_m)`` query blocks (``q_block``),
    ``KT = ceil(kv_len / block_n)`` key/value blocks (``kv_block``); a *row block* is one
    (batch element, q_block) pair, numbered ``b * QT + i``.

    ``run_offsets`` int32[B*QT + 1]
        CSR offsets: the runs of row block ``r`` are ``runs[run_offsets[r]:run_offsets[r+1]]``.
    ``runs`` int32[n_runs, 3]
        ``(kv_begin, kv_end, kind)``: key blocks ``kv_begin <= j < kv_end`` all of ``kind``
        (1 PARTIAL: apply the predicate, 2 FULL: no masking). EMPTY blocks are never listed.
        Runs of one row block are sorted, disjoint, and adjacent runs differ in kind.
    ``work_order`` int32[B*QT]
        Every row block exactly once, heaviest first (cost = FULL + 1.25 * PARTIAL blocks), so a
        grid launched in this order finishes its longest rows first (LPT). Row blocks without runs
        come last: their rows see no key and the kernel must still write O = 0 and LSE = -inf.
    ``mask_data`` int32[...], ``mask_offsets`` int32[B+1]
        The parameter tables the generated predicate reads for PARTIAL blocks; batch element ``b``'s
        table is ``mask_data[mask_offsets[b]:mask_offsets[b+1]]`` and its layout is documented in the
        generated ``mask_row`` function.
    ``col_offsets`` int32[B*KT + 1], ``col_runs`` int32[n_col_runs, 3]
        The transposed view for a backward pass: for column block ``b * KT + j``, runs of
        ``(q_begin, q_end, kind)`` over query blocks.

    The loop that rebuilds the tile classes (and so, with the predicate, the mask)::

        tiles = np.zeros((B, QT, KT), np.int8)
        for r in range(B * QT):
            for begin, end, kind in runs[run_offsets[r]:run_offsets[r + 1]]:
                tiles[r // QT, r % QT, begin:end] = kind
    """

    block_m: int
    block_n: int
    batch: int
    seq_len: int
    kv_len: int
    run_offsets: np.ndarray
    runs: np.ndarray
    work_order: np.ndarray
    mask_data: np.ndarray
    mask_offsets: np.ndarray
    col_offsets: np.ndarray
    col_runs: np.ndarray

    @property
    def n_q_blocks(self) -> int:
        return -(-self.seq_len // self.block_m)

    @property
    def n_kv_blocks(self) -> int:
        return -(-self.kv_len // self.block_n)


@dataclass(frozen=True)
class KernelSpec:
    """Every decision the forward-kernel template needs, made in Python (schedule pass).

    ``predicate`` is CUDA source (from :mod:`maskc.predicate`) that defines::

        struct MaskRow { ... };   // what one query row needs, computed once per row and tile
        __device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q);
        __device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k);

    where ``mask`` is ``mask_data + mask_offsets[b]``. The kernel calls them on PARTIAL blocks only.
    """

    mask_name: str          # a C identifier, already sanitized
    head_dim: int
    dtype: str              # "bf16" or "fp16"
    block_m: int
    block_n: int
    num_warps: int
    predicate: str
    mask_summary: tuple[str, ...] = field(default=())   # comment lines for the kernel's header

    @property
    def entry(self) -> str:
        return f"maskc_fwd_{self.mask_name}"


@dataclass(frozen=True)
class KernelSource:
    """Rendered CUDA: ``source`` defines ``extern "C" __global__`` function ``entry``."""

    spec: KernelSpec
    source: str
    entry: str
    options: tuple[str, ...]   # NVRTC options the source is meant to be compiled with
