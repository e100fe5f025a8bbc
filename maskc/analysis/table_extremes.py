"""The least and greatest entry of a table parameter over any range of indices, exactly, for tables of any size.

What classification reads a table through (:meth:`maskc.analysis.rows.TileIntervals` bounds ``t[index]``
over a tile box by the entries in the index's range): a tile is FULL or EMPTY only where every entry it reads
says so, so a bound that is loose (an entry outside the range counted) turns FULL and EMPTY tiles PARTIAL;
an ancestor matrix ``anc[q, k - p]`` of a few thousand draft tokens read row by row is the case that made it
exact for large tables.

How: a sparse table of block extremes (``mins[j, i]``: the least entry of blocks ``i .. i + 2**j - 1``, two
lookups per range), over blocks of one entry while its size stays within :data:`EXTREME_CELLS`, else of
``block`` entries; a range's whole blocks are read there and its ragged ends (less than a block each) entry by
entry. Memory: at most ``EXTREME_CELLS`` entries per table for each of the two sparse tables, made once per
table (cached while the table lives).
"""
from __future__ import annotations

import weakref

import numpy as np

from maskc.analysis import bitops
from maskc.bound_params import Table

EXTREME_CELLS = 1 << 22
"""Entries of one table's sparse tables (each): 32 MiB of int64; past it the blocks grow (2, 4, ... entries)."""
_GATHER = 1 << 20
"""Entries read at once for the ragged ends of ranges (bounds the temporary arrays at 8 MiB)."""
_EXTREMES: "weakref.WeakKeyDictionary[Table, tuple]" = weakref.WeakKeyDictionary()
_NONE_LEAST, _NONE_GREATEST = np.iinfo(np.int64).max, np.iinfo(np.int64).min     # the extremes of no entry


def table_bounds(table: Table, lo, hi):
    """(least, greatest) entry of ``table`` at indices ``lo .. hi`` (arrays broadcast, ``lo <= hi``; clipped into
    the table: bind proved every index a form takes in range). Exact."""
    n = table.count
    lo, hi = np.broadcast_arrays(np.clip(lo, 0, n - 1), np.clip(hi, 0, n - 1))
    block, mins, maxs = _sparse_tables(table)
    if block == 1:
        return _blocks(mins, maxs, lo, hi)
    first, last = lo // block, hi // block
    inner = first + 1 <= last - 1                                   # whole blocks strictly inside the range
    least, greatest = _blocks(mins, maxs, np.where(inner, first + 1, 0), np.where(inner, last - 1, 0))
    least, greatest = np.where(inner, least, _NONE_LEAST), np.where(inner, greatest, _NONE_GREATEST)
    for a, b in ((lo, np.minimum(hi, (first + 1) * block - 1)),    # the first block's part of the range
                 (np.maximum(lo, last * block), hi)):               # the last's (the same part when first == last)
        end_least, end_greatest = _entries(table.values, a, b, block)
        least, greatest = np.minimum(least, end_least), np.maximum(greatest, end_greatest)
    return least, greatest


def _blocks(mins, maxs, first, last):
    """The extremes over blocks ``first .. last`` (``first <= last``): two overlapping powers of two."""
    level = bitops.bit_length(last - first + 1) - 1
    second = last - (np.int64(1) << level) + 1
    return (np.minimum(mins[level, first], mins[level, second]),
            np.maximum(maxs[level, first], maxs[level, second]))


def _entries(values: np.ndarray, lo, hi, block: int):
    """The extremes of ``values[lo .. hi]`` for ranges shorter than ``block``, read entry by entry."""
    shape = np.shape(lo)
    lo, hi = np.ravel(lo), np.ravel(hi)
    least = np.empty(lo.shape, np.int64)
    greatest = np.empty(lo.shape, np.int64)
    steps = np.arange(block, dtype=np.int64)
    per_pass = max(1, _GATHER // block)
    for s in range(0, len(lo), per_pass):
        at = lo[s:s + per_pass, None] + steps
        inside = at <= hi[s:s + per_pass, None]
        got = values[np.minimum(at, len(values) - 1)]
        least[s:s + per_pass] = np.where(inside, got, _NONE_LEAST).min(axis=1)
        greatest[s:s + per_pass] = np.where(inside, got, _NONE_GREATEST).max(axis=1)
    return least.reshape(shape), greatest.reshape(shape)


def _sparse_tables(table: Table):
    """(block, mins, maxs) of ``table``, made once: ``block`` the smallest power of two that keeps each sparse
    table within EXTREME_CELLS entries."""
    hit = _EXTREMES.get(table)
    if hit is None:
        values, n = table.values, table.count
        block = 1
        while -(-n // block) * max(1, (-(-n // block)).bit_length()) > EXTREME_CELLS:
            block *= 2
        m = -(-n // block)
        padded = np.concatenate([values, np.full(m * block - n, values[-1], np.int64)]).reshape(m, block)
        mins, maxs = [padded.min(axis=1)], [padded.max(axis=1)]
        while 2 ** len(mins) <= m:
            step = 2 ** (len(mins) - 1)
            mins.append(np.concatenate([np.minimum(mins[-1][:-step], mins[-1][step:]), mins[-1][-step:]]))
            maxs.append(np.concatenate([np.maximum(maxs[-1][:-step], maxs[-1][step:]), maxs[-1][-step:]]))
        hit = _EXTREMES[table] = (block, np.stack(mins), np.stack(maxs))
    return hit
