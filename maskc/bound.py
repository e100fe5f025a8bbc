"""The bound mask: a compiled mask with lengths and parameter values (:class:`BoundMask`), and what it gives:
tile maps and descriptors (cached per tile shape), the dense mask and modified scores (the reference), Flex's
BlockMask, mask_mod and score_mod, sub-blocks (``restrict``) and kernel specs for its constants."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from maskc.analysis.bind import check_blocks, check_element, check_index
from maskc.analysis.classify import classify
from maskc.analysis.descriptor import check_size, pack, to_flex_block_mask_arrays
from maskc.analysis.evaluate import dense_mask
from maskc.analysis.order_tiles import classify_ordered
from maskc.analysis.score import modified_scores, score_bound
from maskc.codegen.predicate import pack_mask_data
from maskc.errors import BindError
from maskc.flex_mods import Device, FlexMaskMod, FlexScoreMod
from maskc.bound_params import BoundParams
from maskc.kernel_ir import MAX_DESCRIPTOR_BYTES, BackwardSpec, Descriptor, KernelSpec, TileMap
from maskc.runtime import handles

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

    from maskc.compiled import CompiledMask
    from maskc.restrict import RestrictedMask


@dataclass(frozen=True, eq=False)
class BoundMask:
    """A compiled mask with lengths and parameter values. Everything on the way to a descriptor grows with the
    sequence and the runs of visible tiles, never with the tile grid (only ``tiles()``, ``dense()`` and
    ``to_flex_block_mask()``, which return dense arrays, build them)."""

    mask: CompiledMask
    params: BoundParams

    def __post_init__(self):
        # An int that names this object where only numbers may pass (torch custom ops: maskc.runtime.torch_ops).
        object.__setattr__(self, "handle", handles.register(self))
        object.__setattr__(self, "handle_array", handles.as_array(self.handle))   # the same, as data

    def __repr__(self) -> str:
        shown = [f"seq_len={self.seq_len}"] + ([f"kv_len={self.kv_len}"] if self.kv_len != self.seq_len else [])
        shown += [f"num_heads={self.num_heads}"] if self.num_heads else []
        values = [_values_repr(e) for e in self.params.batch[:3]]
        batch = values[0] if self.batch == 1 else "; ".join(values) + ("; ..." if self.batch > 3 else "")
        return (f"BoundMask({self.mask.name}: {', '.join(shown)}" + (f", batch={self.batch}" if self.batch > 1 else "")
                + (f", {batch}" if batch else "") + ")")

    @property
    def seq_len(self) -> int:
        return self.params.seq_len

    @property
    def kv_len(self) -> int:
        return self.params.kv_len

    @property
    def batch(self) -> int:
        return len(self.params.batch)

    @property
    def num_heads(self) -> int | None:
        return self.params.num_heads

    def dense(self, batch_index: int = 0, head: int = 0) -> np.ndarray:
        """bool[seq_len, kv_len], by brute force: for tests and small sizes."""
        batch_index, head = check_element(batch_index, head, self.batch, self.num_heads)
        return dense_mask(self.mask.resolved, self.params.batch[batch_index], self.seq_len, self.kv_len,
                          head, batch_index)

    def modified_scores(self, scores: np.ndarray, batch_index: int = 0, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(mod(scores), mod'(scores)): the score modifier and its derivative on dense float64 scaled scores
        [seq_len, kv_len] of one batch element and head (the scores and ones without a modifier)."""
        batch_index, head = check_element(batch_index, head, self.batch, self.num_heads)
        return modified_scores(self.mask.resolved, self.params.batch[batch_index], self.seq_len, self.kv_len, head,
                               batch_index, scores, range(self.seq_len), range(self.kv_len))

    def tile_map(self, block_m: int = 128, block_n: int = 128, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> TileMap:
        """Every batch element's tile classes as run-length rows: memory grows with the runs, never with the
        tile grid; more than ``max_bytes`` of them is a BindError (raise the cap for very long sequences)."""
        return _tile_map(self, block_m, block_n, max_bytes)

    def tiles(self, block_m: int = 128, block_n: int = 128) -> np.ndarray:
        """int8[ceil(S/block_m), ceil(K/block_n)]: 0 EMPTY, 1 PARTIAL, 2 FULL (batch element 0;
        ``tile_map().classes`` has every batch element). A dense grid, for those who ask: the descriptor never
        builds it."""
        return self.tile_map(block_m, block_n).classes[0]

    def descriptor(self, block_m: int = 128, block_n: int = 128, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> Descriptor:
        """The kernels' descriptor for these tiles (cached per tile shape): its bytes grow with the runs, at
        most ``max_bytes`` (default 1 GiB), else a BindError before or while it is built."""
        return _descriptor(self, block_m, block_n, max_bytes)

    def restrict(self, q_range, kv_range) -> "RestrictedMask":
        """The sub-block of query rows ``q_range`` and keys ``kv_range`` (``(start, stop)`` pairs or
        ``range``s of step 1) as a bound mask of its own: attention over a slice of q and of k/v, with
        local positions (context parallelism: :mod:`maskc.distributed`). See :mod:`maskc.restrict`."""
        from maskc.restrict import RestrictedMask
        return RestrictedMask.of(self, q_range, kv_range)

    def to_flex_block_mask(self, block_size: int | tuple[int, int] = 128, device: Device = None,
                           B: int | None = None, H: int | None = None) -> "BlockMask":
        """maskc's tile classes as a ``torch.nn.attention.flex_attention.BlockMask`` on ``device`` (default:
        the CPU; ``.to("cuda")`` moves it), with :meth:`flex_mask_mod` for its PARTIAL blocks: feed it
        straight to ``flex_attention``, or to ``maskc.attention``. ``block_size``: one side, or (query, key).
        ``B``, ``H``: the BlockMask's batch and heads, as Flex's ``create_block_mask`` takes them (default: the
        batch the parameters give, else 1; one head); the blocks of a mask the same for every batch element are
        repeated over B, and those of every mask over H (for a mask that reads h, the blocks any head needs:
        the mask_mod hides what a head does not see)."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask

        block_m, block_n = (block_size, block_size) if isinstance(block_size, int) else block_size
        device = device or "cpu"
        batch = check_flex_batch(self, B)
        heads = check_index(H, "H (the BlockMask's heads)", None) if H is not None else 1
        if heads < 1:
            raise BindError(f"H (the BlockMask's heads) must be a positive integer, got {H!r}")
        arrays = to_flex_block_mask_arrays(self.tile_map(block_m, block_n))
        t = {k: torch.from_numpy(v).to(device).expand(batch, heads, *v.shape[2:]).contiguous()
             for k, v in arrays.items()}
        return BlockMask.from_kv_blocks(t["kv_num_blocks"], t["kv_indices"], t["full_kv_num_blocks"],
                                        t["full_kv_indices"], BLOCK_SIZE=(block_m, block_n),
                                        mask_mod=self.flex_mask_mod(device),
                                        seq_lengths=(self.seq_len, self.kv_len))

    def flex_score_mod(self, device: Device = None) -> "FlexScoreMod | None":
        """The mask's score modifier as Flex's ``score_mod`` ``(score, b, h, q_idx, kv_idx)`` (None when the mask
        has none); its tables on ``device`` (default the CPU), following the positions it is called with."""
        return None if self.mask.resolved.score is None else FlexScoreMod(self, device)

    def flex_mask_mod(self, device: Device = None) -> "FlexMaskMod":
        """The mask as a FlexAttention mask_mod in torch operations (O(N) tables, any length), its tables on
        ``device`` (default: the CPU; they follow the positions it is called with to theirs)."""
        return FlexMaskMod(self, device)

    def visible_pairs(self) -> int:
        """The number of visible (q, k) pairs summed over the batch (and the heads of a mask that reads h), never
        with the dense mask: from the row intervals for exact masks, else pair by pair one query block at a
        time."""
        if self.mask.exact:
            from maskc.analysis.classify import visible_pairs
            from maskc.analysis.keys import TooMany
            try:
                return visible_pairs(self.mask.ranges, self.params)
            except TooMany:
                pass
        from maskc.audit import count_visible_pairs
        return count_visible_pairs(self)

    @property
    def constants(self) -> tuple[tuple[str, int], ...]:
        """The values this bind gives the mask's const parameters (part of the kernel's identity)."""
        return self.params.constants(self.mask.const_params)

    def kernel_spec(self, **kwargs) -> KernelSpec:
        """The mask's kernel_spec for this binding: its const values, the 32-bit predicate where bind
        proved it enough, and a softmax against a fixed maximum where its values allow one (:attr:`fixed_max`)."""
        return self.mask.kernel_spec(constants=self.constants, narrow=self.narrow, fixed_max=self.fixed_max, **kwargs)

    @functools.cached_property
    def fixed_max(self) -> bool:
        """Whether the modifier bounds every score of this binding closely enough for the forward's softmax to
        run against a fixed maximum instead of tracking each row's (``softcap`` with every cap at most
        :data:`maskc.codegen.plan.FIXED_MAX_CAP`: every exponent then lands in normal floats)."""
        from maskc.codegen.plan import FIXED_MAX_CAP

        bounds = [score_bound(self.mask.resolved, element, self.seq_len, self.kv_len, self.num_heads, b)
                  for b, element in enumerate(self.params.batch)]
        return all(bound is not None and bound <= FIXED_MAX_CAP for bound in bounds)

    def backward_spec(self, **kwargs) -> BackwardSpec:
        return self.mask.backward_spec(constants=self.constants, narrow=self.narrow, **kwargs)

    @property
    def narrow(self) -> bool:
        """Whether this binding's kernels compute the predicate in 32 bits (bind proved it enough)."""
        return self.params.narrow


def _values_repr(element) -> str:
    """One batch element's values, long segment lists cut short: ``docs=[1000, 3000, 96]``."""
    def short(values) -> str:
        items = [int(v) for v in values]
        return str(items) if len(items) <= 6 else f"[{', '.join(map(str, items[:5]))}, ... ({len(items)} values)]"
    out = [f"{n}={v}" for n, v in element.ints]
    for n, table in element.segments:
        out.append(f"{n}={short(np.diff(table.bounds))}")
        out += [f"{a}={short(v)}" for a, v in table.values]
    out += [f"{n}={short(table.values)}" for n, table in element.tables]
    out += [f"{n}={v:g}" if isinstance(v, float) else f"{n}=[{', '.join(f'{x:g}' for x in v[:5])}"
            f"{', ...' if len(v) > 5 else ''}]" for n, v in element.floats]
    return ", ".join(out)


def check_flex_batch(bound: "BoundMask", B: int | None) -> int:
    """The B of Flex's arrays for ``bound``: ``B`` (a positive integer, equal to the batch the parameters give
    if they give one), else that batch (1 for a mask the same for every element)."""
    if B is None:
        return bound.batch
    if check_index(B, "B (the batch size)", None) < 1:
        raise BindError(f"B (the batch size) must be a positive integer, got {B!r}")
    if bound.batch > 1 and B != bound.batch:
        raise BindError(f"B={B}, but the parameters describe {bound.batch} batch elements", bound.mask.resolved.span)
    return B


def _tile_map(bound: "BoundMask", block_m: int, block_n: int, max_bytes: int) -> TileMap:
    block_m, block_n = check_blocks(block_m, block_n)
    cache = bound.__dict__.setdefault("_tile_maps", {})      # lives and dies with the bound mask
    if (block_m, block_n) not in cache:
        mask = bound.mask
        if mask.order is not None:      # a mask in a token order: from its raster rows (maskc.analysis.order_tiles)
            source = mask.source
            assert source is not None, "compile_ordered keeps the mask it rewrote"
            per_element = [source.specialized(e.ints) for e in bound.params.batch]
            cache[block_m, block_n] = classify_ordered(per_element, bound.params, mask.order, block_m, block_n,
                                                       max_bytes)
        else:
            per_element = [mask.specialized(e.ints) for e in bound.params.batch]
            cache[block_m, block_n] = classify(per_element, bound.params, block_m, block_n, max_bytes)
    else:
        check_size(cache[block_m, block_n], max_bytes)
    return cache[block_m, block_n]


def _descriptor(bound: "BoundMask", block_m: int, block_n: int, max_bytes: int) -> Descriptor:
    block_m, block_n = check_blocks(block_m, block_n)
    cache = bound.__dict__.setdefault("_descriptors", {})
    if (block_m, block_n) not in cache:
        data, offsets = pack_mask_data(bound.mask.ranges, bound.params)
        cache[block_m, block_n] = pack(_tile_map(bound, block_m, block_n, max_bytes), data, offsets, max_bytes)
    else:
        check_size(cache[block_m, block_n], max_bytes)
    return cache[block_m, block_n]
