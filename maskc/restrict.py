"""A sub-block of a bound mask as a bound mask of its own: query rows [q0, q1), keys [k0, k1).

    sub = bound.restrict((q0, q1), (k0, k1))
    maskc.attention(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], sub, return_lse=True)

``sub`` has ``seq_len = q1 - q0`` and ``kv_len = k1 - k0`` and is visible exactly where the parent is,
shifted: ``sub.dense(b, h) == bound.dense(b, h)[q0:q1, k0:k1]``. The mask's own arithmetic still sees the
parent's positions and lengths (``seq_len`` in a .mask file stays the parent's). Context parallelism
(:mod:`maskc.distributed`) computes each rank's attention from such blocks and merges them by LSE.

Tiles: a tile of the sub-block, ``block_m x block_n`` from its own origin, is classified from the parent's
tiles at the finest grid that lines up with both (block gcd with the offsets): FULL where all of those are
FULL, EMPTY where all are EMPTY, else PARTIAL. So the classes are sound, and exact when the parent's are;
when q0 and k0 are multiples of the blocks (the usual case) the parent's cached tile map is reused as it is.
The sub-block's runs come from the parent's runs, never from a grid of tiles. Kernels: the compiled mask's
twin with ``offsets`` (:meth:`CompiledMask.with_offsets`, one per compiled mask, shared by every sub-block)
reads (q0, k0) from the head of the mask table (:mod:`maskc.codegen.predicate`). This object offers what the GPU
runtime and the torch ops ask of a bound mask (:mod:`maskc.runtime`'s docstring) plus ``dense``, ``tiles``
and ``restrict``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from maskc.analysis.bind import check_element
from maskc.analysis.descriptor import check_size, pack
from maskc.analysis.evaluate import dense_mask
from maskc.analysis.score import modified_scores
from maskc.analysis.tiles import block_runs, merge_runs
from maskc.codegen.predicate import pack_mask_data
from maskc.kernel_ir import FULL, MAX_DESCRIPTOR_BYTES, Descriptor, TileMap
from maskc.runtime import handles

if TYPE_CHECKING:
    from maskc.pipeline import BoundMask


def _span(r, length: int, what: str) -> tuple[int, int]:
    """(start, stop) from a (start, stop) pair or a range of step 1, checked against [0, length]."""
    if isinstance(r, range):
        if r.step != 1:
            raise ValueError(f"{what} must be a range of step 1, got {r!r}")
        r = (r.start, r.stop)
    try:
        start, stop = (int(x) for x in r)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a (start, stop) pair, got {r!r}") from None
    if not 0 <= start < stop <= length:
        raise ValueError(f"{what} = [{start}, {stop}) is not a non-empty range inside [0, {length})")
    return start, stop


@dataclass(frozen=True, eq=False)
class RestrictedMask:
    """Query rows [q_start, q_stop) and keys [kv_start, kv_stop) of ``parent`` (see the module docstring)."""

    parent: "BoundMask"
    q_start: int
    q_stop: int
    kv_start: int
    kv_stop: int
    handle: int = field(init=False, repr=False, default=0)     # for the torch custom ops

    @classmethod
    def of(cls, bound: "BoundMask | RestrictedMask", q_range, kv_range) -> "RestrictedMask":
        """The sub-block of ``bound`` (a BoundMask or a RestrictedMask: ranges are then relative to it)."""
        q0, q1 = _span(q_range, bound.seq_len, "q_range")
        k0, k1 = _span(kv_range, bound.kv_len, "kv_range")
        if isinstance(bound, RestrictedMask):
            return cls(bound.parent, bound.q_start + q0, bound.q_start + q1, bound.kv_start + k0, bound.kv_start + k1)
        return cls(bound, q0, q1, k0, k1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "handle", handles.register(self))
        object.__setattr__(self, "handle_array", handles.as_array(self.handle))   # the same, as data

    def restrict(self, q_range, kv_range) -> "RestrictedMask":
        return RestrictedMask.of(self, q_range, kv_range)

    # ---- what a bound mask offers ----
    seq_len = property(lambda self: self.q_stop - self.q_start)
    kv_len = property(lambda self: self.kv_stop - self.kv_start)
    batch = property(lambda self: self.parent.batch)
    num_heads = property(lambda self: self.parent.num_heads)
    constants = property(lambda self: self.parent.constants)
    narrow = property(lambda self: self.parent.narrow)      # positions stay inside the parent's

    @property
    def mask(self):
        """The parent's compiled mask with ``offsets``: its kernels take positions local to the block."""
        return self.parent.mask.with_offsets()

    @property
    def origin(self) -> tuple[int, int]:
        return self.q_start, self.kv_start

    def dense(self, batch_index: int = 0, head: int = 0) -> np.ndarray:
        """bool[seq_len, kv_len], pair by pair from the source (only this block is evaluated)."""
        p = self.parent
        batch_index, head = check_element(batch_index, head, p.batch, p.num_heads)
        return dense_mask(p.mask.resolved, p.params.batch[batch_index], p.seq_len, p.kv_len, head, batch_index,
                          rows=range(self.q_start, self.q_stop), cols=range(self.kv_start, self.kv_stop))

    def modified_scores(self, scores: np.ndarray, batch_index: int = 0, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """As BoundMask.modified_scores, for this block (the modifier sees the parent's positions)."""
        p = self.parent
        batch_index, head = check_element(batch_index, head, p.batch, p.num_heads)
        return modified_scores(p.mask.resolved, p.params.batch[batch_index], p.seq_len, p.kv_len, head, batch_index,
                               scores, range(self.q_start, self.q_stop), range(self.kv_start, self.kv_stop))

    def tile_map(self, block_m: int = 128, block_n: int = 128, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> TileMap:
        cache = self.__dict__.setdefault("_tile_maps", {})
        if (block_m, block_n) not in cache:
            cache[block_m, block_n] = _restricted_tile_map(self, block_m, block_n, max_bytes)
        else:
            check_size(cache[block_m, block_n], max_bytes)
        return cache[block_m, block_n]

    def tiles(self, block_m: int = 128, block_n: int = 128) -> np.ndarray:
        return self.tile_map(block_m, block_n).classes[0]

    def descriptor(self, block_m: int = 128, block_n: int = 128, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> Descriptor:
        cache = self.__dict__.setdefault("_descriptors", {})
        if (block_m, block_n) not in cache:
            data, offsets = pack_mask_data(self.parent.mask.ranges, self.parent.params, origin=self.origin)
            cache[block_m, block_n] = pack(self.tile_map(block_m, block_n, max_bytes), data, offsets, max_bytes)
        else:
            check_size(cache[block_m, block_n], max_bytes)
        return cache[block_m, block_n]

    def kernel_spec(self, **kwargs):
        return self.mask.kernel_spec(constants=self.constants, narrow=self.narrow, **kwargs)

    def backward_spec(self, **kwargs):
        return self.mask.backward_spec(constants=self.constants, narrow=self.narrow, **kwargs)


def _fine_step(block: int, start: int, stop: int, length: int) -> int:
    """The largest step dividing the block and both ends of [start, stop) (the parent's end needs not)."""
    return math.gcd(block, start, stop if stop < length else 0)


def _restricted_tile_map(sub: RestrictedMask, block_m: int, block_n: int, max_bytes: int) -> TileMap:
    """Sound (exact when the parent's are) classes of the sub-block's tiles, from the parent's runs at a grid
    that lines up with the sub-block's ends and tiles (see the module docstring): a tile is PARTIAL or FULL
    where a fine tile of it is not EMPTY, FULL where every fine tile is FULL (those past the sub-block's
    ends count as FULL). O(runs of the window's rows), never a grid."""
    parent = sub.parent
    gm = _fine_step(block_m, sub.q_start, sub.q_stop, parent.seq_len)
    gn = _fine_step(block_n, sub.kv_start, sub.kv_stop, parent.kv_len)
    fine = parent.tile_map(gm, gn, max_bytes)
    r0, r1 = sub.q_start // gm, -(-sub.q_stop // gm)
    c0, c1 = sub.kv_start // gn, -(-sub.kv_stop // gn)
    fm, fn = block_m // gm, block_n // gn
    qt, kt = -(-(r1 - r0) // fm), -(-(c1 - c0) // fn)
    fine_qt = fine.n_q_blocks
    row = np.concatenate([np.repeat(np.arange(b * fine_qt + r0, b * fine_qt + r1),
                                    np.diff(fine.run_offsets[b * fine_qt + r0: b * fine_qt + r1 + 1]))
                          for b in range(parent.batch)])
    runs = np.concatenate([fine.runs[fine.run_offsets[b * fine_qt + r0]: fine.run_offsets[b * fine_qt + r1]]
                           for b in range(parent.batch)]).astype(np.int64)
    begin, end = np.maximum(runs[:, 0], c0) - c0, np.minimum(runs[:, 1], c1) - c0
    keep = begin < end
    row, begin, end, kind = row[keep], begin[keep], end[keep], runs[keep, 2]
    coarse = (row // fine_qt) * qt + (row % fine_qt - r0) // fm
    full = kind == FULL
    c_lo = -(-begin[full] // fn)
    c_hi = np.where(end[full] >= c1 - c0, kt, end[full] // fn)     # past the sub-block's end counts as FULL
    ok = c_lo < c_hi
    need = np.tile(np.minimum(fm, (r1 - r0) - np.arange(qt) * fm), parent.batch)   # fine rows per tile row
    found = block_runs((coarse, begin // fn, -(-end // fn)), (coarse[full][ok], c_lo[ok], c_hi[ok]), need, kt)
    offsets, runs = merge_runs(*found, parent.batch * qt)
    tile_map = TileMap(block_m, block_n, sub.seq_len, sub.kv_len, parent.batch, offsets, runs, exact=fine.exact)
    check_size(tile_map, max_bytes)
    return tile_map
