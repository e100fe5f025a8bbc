"""A bound mask run in a token order (:mod:`maskc.analysis.order`): the order chosen for a binding, the mask
rewritten in it and bound to the same values, and the permutation that takes q, k and v there and the output
back.

    ordered = token_order(bound, "auto")   # an OrderedMask, or None: the raster order
    ordered = token_order(bound, options)  # the same for the order an Options value runs in (its token_order)
    ordered.inner                          # the rewritten mask, bound: its tiles and kernels are the order's
    ordered.permutation                    # int64[seq_len]: the raster position of each token of the order
    # attention(q, k, v, bound) == attention(q[:, :, p], k[:, :, p], v[:, :, p], ordered.inner)[:, :, inverse]

The runtime (:mod:`maskc.runtime.kernels` on the GPU, :mod:`maskc.runtime.torch_ops` on the CPU) does this for
every call whose options ask for it (``Options.token_order``: ``"auto"``, the default, ``"raster"`` or a patch
shape such as ``"8x16"``), so the backward runs in the same order, and outputs, LSE and gradients come back in
the raster order. Kernels, descriptors and the autotuner's choices are the rewritten mask's, cached as any
mask's are (its kernel's source names the order).

``"auto"`` picks, per binding, the order whose tiles promise the least work: for a sample of q_blocks (in each
order's coordinates) the FULL and PARTIAL tiles are counted exactly (:func:`maskc.analysis.order_tiles.block_costs`)
and weighed as the forward kernel spends on them (a PARTIAL tile on the stored path, what the kernels take for
a mask that reads no h: :data:`STORED_PARTIAL_COST` FULL ones in raster, :data:`STORED_ORDERED_PARTIAL_COST` in an
order; on the tile path :data:`CHUNKED_PARTIAL_COST` and :data:`ORDERED_PARTIAL_COST`), an order also paying
:data:`GATHER_COST` per q_block for gathering q, k and v and scattering the output; it must save at least
:data:`MIN_SAVING` of the raster order's work to be taken. An order applies only to a bound mask (not a
sub-block) with kv_len == seq_len, whose mask :func:`~maskc.analysis.order.image_grid` finds an image in, whose
tiles are exact in raster and in the order, and whose length holds a whole band; ``"auto"`` falls back to raster
otherwise, a patch shape asked for is a MaskError naming why.
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from maskc.analysis.normalize import specialize
from maskc.analysis.order import Grid, TokenOrder, candidates, image_grid, parse_order
from maskc.analysis.order_tiles import block_costs
from maskc.bound import BoundMask
from maskc.compiled import CompiledMask
from maskc.errors import MaskError
from maskc.kernel_ir import AUTO_STORED
from maskc.options import Options
from maskc.pipeline import compile_ordered

CHUNKED_PARTIAL_COST = 2.6
"""A PARTIAL tile's forward time in FULL tiles: run 38 (bench/NOTES.md) timed CLEAR at 32K, 2032 FULL and 7572
PARTIAL tiles, at 101 TF/s, and causal (almost all FULL) at 634 TF/s: a PARTIAL tile took 2.6 FULL ones."""
ORDERED_PARTIAL_COST = 3.3
"""A PARTIAL tile of an order's kernel in FULL tiles: run 53 (bench/NOTES.md), CLEAR at 32K in 8 x 16 patches
on inputs already in the order, 2032 FULL and 3422 PARTIAL tiles in 2.79 ms (43 ns a tile and head against a
FULL tile's 13.2 ns; 30-43 ns across clear and neighborhood at 4K and 32K). Fitted before the disc's root tables
(run 55), which made PARTIAL tiles cheaper in both orders: clear at 32K is now near break-even (139 TF/s in
8 x 16 with the gathers, 136 raster)."""
STORED_PARTIAL_COST = 1.24
"""A PARTIAL tile of the stored path (``Options.partial_tiles``, maskc.runtime.state.stored_words) in raster, in
FULL tiles: run 73 (bench/NOTES.md, H100), CLEAR at 32K in raster, 2032 FULL and 7572 PARTIAL tiles, 2.409 ms for 16
heads: 16.3 ns a PARTIAL tile and head against a FULL tile's 13.2 ns."""
STORED_ORDERED_PARTIAL_COST = 1.55
"""A PARTIAL tile of the stored path in an order, in FULL tiles: run 73, CLEAR at 32K in 8 x 16 patches on inputs
already in the order, 2032 FULL and 3422 PARTIAL tiles in 1.547 ms (20.4 ns a tile and head). Why it is above the
raster order's was not profiled."""
GATHER_COST = 5
"""The gathers and the scatter of a call in an order, per q_block, in FULL tiles: run 53 timed 0.79-0.81 ms
of them at 32K as torch copies (B=1, H=16, D=128: 195 ns per q_block and head, 15 FULL tiles); run 58 the moves
kernel that replaced them (one launch each way) at 0.265 ms: 5 FULL tiles."""
MIN_SAVING = 0.1
"""The least share of the raster order's tile work an order must save to be taken (``"auto"``)."""
SAMPLE_BLOCKS = 32
"""q_blocks whose tiles ``"auto"`` counts per order, evenly spread over the sequence."""
TILE = (128, 128)
"""The tiles ``"auto"`` weighs orders at: the Hopper forward kernel's (maskc.codegen.schedule)."""


@dataclass(frozen=True, eq=False)
class OrderedMask:
    """``parent`` run in ``order``: ``inner`` is the rewritten mask bound to ``parent``'s values (module
    docstring)."""

    parent: BoundMask
    order: TokenOrder
    inner: BoundMask

    @property
    def permutation(self) -> np.ndarray:
        """int64[seq_len]: ``permutation[i]`` is the raster position of the i-th token of the order."""
        if "_permutation" not in self.__dict__:
            self.__dict__["_permutation"] = self.order.permutation(self.parent.seq_len)
        return self.__dict__["_permutation"]

    @property
    def inverse(self) -> np.ndarray:
        """int64[seq_len]: the place in the order of each raster position."""
        if "_inverse" not in self.__dict__:
            self.__dict__["_inverse"] = self.order.index(np.arange(self.parent.seq_len), self.parent.seq_len)
        return self.__dict__["_inverse"]

    def __repr__(self) -> str:
        return f"OrderedMask({self.parent!r} in {self.order.name} patches)"


def token_order(bound, choice: str | Options = "auto") -> OrderedMask | None:
    """``bound`` in the token order ``choice`` asks for (module docstring), or None for the raster order; kept on
    the bound mask per choice, and on its compiled mask per values: a mask bound again to the same lengths and
    values (a training loop that binds every step) reuses the choice and the rewritten mask's tiles. ``choice``:
    ``"auto"``, ``"raster"`` or a patch shape, or an :class:`~maskc.options.Options` (its ``token_order``: the
    order the runtime runs ``bound`` in with those options; ``"auto"`` weighs PARTIAL tiles as the kernels
    those options build spend on them, a string as the default Options' do)."""
    if isinstance(choice, Options):
        options = choice
    elif isinstance(choice, str):
        options = Options(token_order=choice)           # a ValueError for a choice it does not know
    else:
        raise TypeError(f"token_order() takes 'auto', 'raster', a patch shape such as '8x16', or a maskc.Options; "
                        f"not {type(choice).__name__} {choice!r}")
    # Only "auto" weighs tiles, so only its choice depends on the path of PARTIAL tiles
    asked = (options.token_order, options.token_order == "auto" and _weighs_stored(bound, options))
    cache = bound.__dict__.setdefault("_token_orders", {})
    if asked not in cache:
        key = _values_key(bound, asked)
        seen = bound.mask.__dict__.setdefault("_token_orders", {}) if key is not None else {}
        if key in seen:
            order, inner = seen[key]
            cache[asked] = None if order is None else OrderedMask(bound, order, inner)
        else:
            cache[asked] = found = _token_order(bound, *asked)
            if key is not None:
                if len(seen) >= _SEEN:
                    seen.pop(next(iter(seen)))
                seen[key] = (None, None) if found is None else (found.order, found.inner)
    return cache[asked]


def _weighs_stored(bound, options: Options) -> bool:
    """Whether ``"auto"`` weighs PARTIAL tiles as the stored path spends on them: the kernels take it where the
    options leave it to them (maskc.kernel_ir.AUTO_STORED) and the mask's visibility is the same for every head.
    Where the words would pass ``max_descriptor_bytes`` the kernels take the tile path; the order is still the
    one chosen for the stored path (the words' size is known only once the order's tiles are)."""
    return (options.partial_tiles in AUTO_STORED and isinstance(bound, BoundMask)
            and not bound.mask.ranges.uses_head)


_SEEN = 16      # bindings whose choice a compiled mask keeps


def _values_key(bound, asked: tuple[str, bool]):
    """What a binding's choice depends on, hashable; None for what never gets an order (no values to read)."""
    if _refused(bound) is not None or any(p.kind in ("segments", "per") for p in bound.mask.params):
        return None
    return (asked, bound.seq_len, bound.kv_len, bound.num_heads, repr(sorted(_values(bound).items())))


def _token_order(bound, choice: str, stored: bool) -> OrderedMask | None:
    """The order ``choice`` (an Options' token_order, checked there) gives ``bound`` (None: raster); ``stored``:
    "auto" weighs the stored path's tiles."""
    if choice == "raster":
        return None
    shape = parse_order(choice)             # None for "auto"
    mask: CompiledMask = bound.mask
    why = _refused(bound)
    grid = None
    if why is None:
        found = image_grid(mask.resolved, specialize(mask.normal, dict(bound.constants)))
        grid, why = (None, found) if isinstance(found, str) else (found, None)
    if grid is None:
        if shape is None:
            return None
        raise MaskError(f"token order {choice} asked for, and mask '{mask.name}' cannot run in one: {why}",
                        mask.resolved.span)
    if shape is not None:
        order = TokenOrder(grid.origin, grid.width, *_checked(shape, grid, mask))
        if not order.applies(bound.seq_len):
            raise MaskError(f"token order {choice}: seq_len = {bound.seq_len} holds no whole band of {order.rows} "
                            f"image rows (from position {order.origin}, {order.width} wide)", mask.resolved.span)
        return _bind(bound, order)
    return _auto(bound, [o for o in candidates(grid, TILE[1]) if o.applies(bound.seq_len)], stored)


def in_order(mask: CompiledMask, shape: str, constants=()) -> CompiledMask:
    """The compiled ``mask`` rewritten in patches of ``shape`` (``"8x16"``) over its image, with its const parameters
    at ``constants`` (else their defaults): the kernels ``maskc compile --token-order`` writes. MaskError where the
    mask admits no such order."""
    parsed = parse_order(shape)
    if parsed is None:
        raise ValueError(f"token order {shape!r}: expected a patch shape such as '8x16' (rows x columns)")
    values = mask.const_values(constants)
    grid = image_grid(mask.resolved, specialize(mask.normal, dict(values)))
    if isinstance(grid, str):
        raise MaskError(f"token order {shape} asked for, and mask '{mask.name}' cannot run in one: {grid}",
                        mask.resolved.span)
    return compile_ordered(mask, TokenOrder(grid.origin, grid.width, *_checked(parsed, grid, mask)), values)


def _refused(bound) -> str | None:
    """Why no order applies to ``bound`` whatever its mask reads, or None."""
    if not isinstance(bound, BoundMask):
        return "a sub-block (restrict) keeps the raster order"
    if bound.mask.order is not None:
        return "it is already in a token order"
    if bound.kv_len != bound.seq_len:
        return f"kv_len = {bound.kv_len} differs from seq_len = {bound.seq_len} (queries and keys share the order)"
    if not bound.mask.exact:
        return "its tiles are only sound in raster order (an order is chosen from exact tiles)"
    return None


def _checked(shape: tuple[int, int], grid: Grid, mask: CompiledMask) -> tuple[int, int]:
    rows, cols = shape
    if grid.width % cols or cols == grid.width:
        raise MaskError(f"token order {rows}x{cols}: patches {cols} wide must divide the image's width {grid.width} "
                        "and be narrower", mask.resolved.span, "cols = 1 takes each band column by column")
    return rows, cols


def _bind(bound, order: TokenOrder) -> OrderedMask:
    """``bound``'s values bound to its mask rewritten in ``order`` (MaskError when the rewrite is not exact)."""
    twin = compile_ordered(bound.mask, order, bound.constants)
    inner = twin.bind(bound.seq_len, bound.kv_len, bound.num_heads, **_values(bound))
    return OrderedMask(bound, order, inner)


def _values(bound) -> dict:
    """The bind keywords that give ``bound``'s parameter values again (ints, floats and tables; a batch as lists)."""
    batch = bound.params.batch
    out = {}
    for p in bound.mask.params:
        if p.kind == "int":
            values = [e.int(p.name) for e in batch]
        elif p.kind in ("float", "float_table"):
            values = [e.float(p.name) for e in batch]
            values = [v.tolist() if isinstance(v, np.ndarray) else v for v in values]
        elif p.kind == "table":
            values = [e.table(p.name).values.reshape(e.table(p.name).shape).tolist() for e in batch]
        else:
            raise AssertionError("image_grid refuses masks with segments")
        out[p.name] = values[0] if len(batch) == 1 else values
    return out


def _auto(bound, orders: list[TokenOrder], stored: bool) -> OrderedMask | None:
    """The order among ``orders`` whose sampled tiles weigh least, if it saves MIN_SAVING of raster's; PARTIAL
    tiles weighed as the stored path's (``stored``) or the tile path's."""
    if not orders:
        return None
    block_m, block_n = TILE
    qt = -(-bound.seq_len // block_m)
    sample = np.unique(np.linspace(0, qt - 1, min(qt, SAMPLE_BLOCKS)).round().astype(np.int64))
    ranges = bound.mask.specialized(bound.params.batch[0].ints)

    def cost(order):
        full, partial = block_costs(ranges, bound.params.batch[0], order, bound.seq_len, block_m, block_n, sample)
        if order is None:
            return full + (STORED_PARTIAL_COST if stored else CHUNKED_PARTIAL_COST) * partial
        partial_cost = STORED_ORDERED_PARTIAL_COST if stored else ORDERED_PARTIAL_COST
        return full + partial_cost * partial + GATHER_COST * len(sample)

    best, best_cost = None, (1 - MIN_SAVING) * cost(None)
    for order in orders:
        try:
            compile_ordered(bound.mask, order, bound.constants)
        except MaskError:
            continue                    # the rewrite's tiles would not be exact: not this order
        c = cost(order)
        if c < best_cost:
            best, best_cost = order, c
    return None if best is None else _bind(bound, best)
