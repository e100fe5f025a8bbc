"""Pass 7, descriptor packing: :class:`~maskc.kernel_ir.TileMap` → :class:`~maskc.kernel_ir.Descriptor`.

Invariant: the runs list exactly the non-EMPTY tiles of each row block with their classes (sorted,
disjoint, adjacent runs of different kinds), the transposed view lists the same tiles by column
block, and ``work_order`` is a permutation of the row blocks by non-increasing cost, empty row
blocks last. Packing is O(runs + row blocks); the transposed view, O(runs log runs + its own runs), is
built from the runs when first asked for. Neither builds the tile grid; the descriptor's bytes stay
within ``max_bytes`` (a BindError naming it otherwise).
"""
from __future__ import annotations

import functools

import numpy as np

from maskc.kernel_ir import FULL, MAX_DESCRIPTOR_BYTES, PARTIAL, Descriptor, TileMap
from maskc.runs import RunBudget, heaviest_first, sizes_text


def pack(tile_map: TileMap, mask_data: np.ndarray, mask_offsets: np.ndarray,
         max_bytes: int = MAX_DESCRIPTOR_BYTES) -> Descriptor:
    """Pack tile runs and the predicate's parameter tables (see the module docstring)."""
    work_order = heaviest_first(tile_map.run_offsets, tile_map.runs)
    desc = Descriptor(tile_map, work_order, np.ascontiguousarray(mask_data, np.int32),
                      np.ascontiguousarray(mask_offsets, np.int32), max_bytes)
    check_size(desc, max_bytes)
    return desc


def check_size(desc: Descriptor | TileMap, max_bytes: int) -> None:
    """A BindError naming ``max_bytes`` where the descriptor (or tile map) takes more bytes."""
    RunBudget(max_bytes,
              functools.partial(sizes_text, desc.seq_len, desc.kv_len, desc.block_m, desc.block_n, desc.batch),
              desc.nbytes)


def unpack(desc: Descriptor) -> np.ndarray:
    """int8[B, QT, KT] tile classes rebuilt from the runs (the loop of the Descriptor docstring)."""
    qt, kt = desc.n_q_blocks, desc.n_kv_blocks
    tiles = np.zeros((desc.batch, qt, kt), np.int8)
    for r in range(desc.batch * qt):
        for begin, end, kind in desc.runs[desc.run_offsets[r]:desc.run_offsets[r + 1]]:
            tiles[r // qt, r % qt, begin:end] = kind
    return tiles


def check_descriptor(desc: Descriptor) -> None:
    """The descriptor's invariants, as assertions (always on in tests)."""
    qt, kt = desc.n_q_blocks, desc.n_kv_blocks
    assert desc.run_offsets.shape == (desc.batch * qt + 1,) and desc.run_offsets[0] == 0
    assert np.all(np.diff(desc.run_offsets) >= 0) and desc.run_offsets[-1] == len(desc.runs)
    for r in range(desc.batch * qt):
        runs = desc.runs[desc.run_offsets[r]:desc.run_offsets[r + 1]]
        assert np.all(runs[:, 0] < runs[:, 1]) and np.all(np.isin(runs[:, 2], (PARTIAL, FULL)))
        assert np.all(runs[1:, 0] >= runs[:-1, 1]) and runs[:, 1].max(initial=0) <= kt
        adjacent = runs[1:, 0] == runs[:-1, 1]
        assert not np.any(adjacent & (runs[1:, 2] == runs[:-1, 2])), "adjacent runs of one kind"
    assert sorted(desc.work_order.tolist()) == list(range(desc.batch * qt))
    for arr in (desc.run_offsets, desc.runs, desc.work_order, desc.mask_data, desc.mask_offsets,
                desc.col_offsets, desc.col_runs, desc.col_work_order):
        assert arr.dtype == np.int32 and arr.flags.c_contiguous
    assert desc.col_offsets.shape == (desc.batch * kt + 1,)
    assert sorted(desc.col_work_order.tolist()) == list(range(desc.batch * kt))


def to_flex_block_mask_arrays(tile_map: TileMap) -> dict[str, np.ndarray]:
    """FlexAttention's BlockMask arrays (``kv_num_blocks``, ``kv_indices``, ``full_kv_num_blocks``,
    ``full_kv_indices``), int32 of shapes [B, 1, QT] and [B, 1, QT, KT].

    Flex keeps PARTIAL blocks (``kv_*``, the mask_mod is applied) apart from FULL ones
    (``full_kv_*``); indices of each row are ascending and the unused tail is zero.
    """
    classes = tile_map.classes
    b, qt, kt = classes.shape
    out = {}
    for prefix, kind in (("", PARTIAL), ("full_", FULL)):
        hit = classes == kind
        counts = hit.sum(-1).astype(np.int32)
        # Stable sort puts the hits' column indices first, in ascending order.
        order = np.argsort(~hit, axis=-1, kind="stable").astype(np.int32)
        order[np.arange(kt)[None, None, :] >= counts[..., None]] = 0
        out[prefix + "kv_num_blocks"] = counts[:, None, :]
        out[prefix + "kv_indices"] = np.ascontiguousarray(order[:, None, :, :])
    return out
