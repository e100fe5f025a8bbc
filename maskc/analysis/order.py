"""Token orders for masks over an image: what a patch order is, and which ones a mask admits.

A *token order* is a permutation of the positions ``[0, seq_len)``: ``raster(i)`` is the position, in the mask's
own (raster) coordinates, of the i-th token in the order. maskc runs a mask in a token order by gathering q, k
and v into it, running the kernels of the mask rewritten in the order's coordinates
(:mod:`maskc.analysis.reorder`) and scattering the output back (:mod:`maskc.ordered`); any permutation gives the
same attention, so an order changes only which pairs share a tile.

Why: a mask over an image ``width`` tokens wide (CLEAR's disc, NATTEN's window, a video's spatio-temporal window)
sees, from one raster tile of 128 queries (one image row), a thin slice of each of many image rows: 30 PARTIAL
key tiles a fifth full for CLEAR's disc of radius 16 (bench/NOTES.md, run 38). In patches of 8 rows by 16 columns
a tile's queries are close together in both directions and so are the keys they see: 14 PARTIAL tiles instead of
30 (bench/patch_density.py).

:class:`TokenOrder` is the family maskc builds: the image (positions ``[origin, ...)``, rows of ``width``) cut
into *bands* of ``rows`` image rows, each band into *patches* of ``rows`` x ``cols`` (``cols`` dividing the
width) taken left to right, each patch row by row. Positions before the image and after its last whole band
keep their places (a short last band, or a last row the sequence does not fill, stays in raster order).
With ``rows * cols`` a divisor of the tile, a tile of queries is a whole number of patches side by side: 8 x 16
at 128 tokens for ``TokenOrder(rows=8, cols=16)``; ``cols = 1`` (any width, even a prime one) takes each band
column by column, which makes the same 8 x 16 tiles out of 16 consecutive columns.

:func:`image_grid` finds a mask's image: the width is the smallest constant divisor by which it floors a
position (``(k - text) // width``), the origin where those floors start counting rows (``text``); the mask
must read positions only through arithmetic (no segments: a segment table is laid out in raster positions).
:func:`candidates` lists the orders worth trying; which of them compiles to exact tiles, and which is fastest
for a binding, is decided later (:func:`maskc.pipeline.compile_ordered`, :mod:`maskc.ordered`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.ir.walk import nodes

PATCH_ROWS = (4, 8, 16)
"""Band heights :func:`candidates` tries: from patches of 4 x 32 to 16 x 8 at 128 tokens (bench/NOTES.md: 8
rows are best for CLEAR and NATTEN at 128 x 128 tiles, 16 within 10%, 4 and 32 far behind)."""


@dataclass(frozen=True)
class TokenOrder:
    """Patches of ``rows`` x ``cols`` image tokens, in bands of ``rows`` image rows of ``width`` tokens from
    ``origin`` (see the module docstring). ``cols`` divides ``width``."""

    origin: int
    width: int
    rows: int
    cols: int

    def __post_init__(self):
        if not (self.origin >= 0 and self.width >= 1 and self.rows >= 1 and 1 <= self.cols <= self.width
                and self.width % self.cols == 0):
            raise ValueError(f"not a token order: {self!r} (cols must divide the width)")

    @property
    def name(self) -> str:
        """``8x16``: rows x cols of a patch (what ``Options(token_order=...)`` takes)."""
        return f"{self.rows}x{self.cols}"

    def __str__(self) -> str:
        return (f"patches of {self.rows} x {self.cols} in bands of {self.rows} rows of an image {self.width} wide "
                f"from position {self.origin}")

    @property
    def band(self) -> int:
        """Tokens in one band: ``rows`` image rows."""
        return self.rows * self.width

    def end(self, seq_len: int) -> int:
        """The end of the last whole band at ``seq_len`` (``origin`` when there is none): positions from it on
        keep their places."""
        return self.origin + self.band * max(0, (seq_len - self.origin) // self.band)

    def applies(self, seq_len: int) -> bool:
        """Whether ``seq_len`` holds a whole band (else the order is the identity)."""
        return self.end(seq_len) > self.origin

    def raster(self, i: np.ndarray, seq_len: int) -> np.ndarray:
        """The raster position of the tokens at ``i`` in the order (int64; the permutation at ``seq_len``)."""
        i = np.asarray(i, dtype=np.int64)
        u = i - self.origin
        inside = (i >= self.origin) & (i < self.end(seq_len))
        y = self.rows * (u // self.band) + (u // self.cols) % self.rows
        x = self.cols * ((u // (self.rows * self.cols)) % (self.width // self.cols)) + u % self.cols
        return np.where(inside, self.origin + self.width * y + x, i)

    def index(self, r: np.ndarray, seq_len: int) -> np.ndarray:
        """The place in the order of the tokens at raster positions ``r`` (the inverse of :meth:`raster`)."""
        r = np.asarray(r, dtype=np.int64)
        u = r - self.origin
        inside = (r >= self.origin) & (r < self.end(seq_len))
        y, x = u // self.width, u % self.width
        at = (self.band * (y // self.rows) + self.rows * self.cols * (x // self.cols) + self.cols * (y % self.rows)
              + x % self.cols)
        return np.where(inside, self.origin + at, r)

    def permutation(self, seq_len: int) -> np.ndarray:
        """int64[seq_len]: the raster position of every token in the order."""
        return self.raster(np.arange(seq_len, dtype=np.int64), seq_len)

    def raster_expr(self, p: ir.IntExpr) -> ir.IntExpr:
        """:meth:`raster` inside the bands as an expression of the position ``p``, in ``//`` and ``%`` by
        constants: ``origin + width * y + x`` with ``u = p - origin``, ``y = rows * (u // band) + (u // cols) %
        rows`` and ``x = cols * ((u // (rows*cols)) % (width / cols)) + u % cols``."""
        def c(v: int) -> ir.Const:
            return ir.Const(v)

        def op(o: str, a: ir.IntExpr, b: ir.IntExpr) -> ir.Arith:
            return ir.Arith(o, a, b)

        u = op("-", p, c(self.origin))
        y = op("+", op("*", c(self.rows), op("//", u, c(self.band))), op("%", op("//", u, c(self.cols)), c(self.rows)))
        x = op("+", op("*", c(self.cols), op("%", op("//", u, c(self.rows * self.cols)), c(self.width // self.cols))),
               op("%", u, c(self.cols)))
        return op("+", c(self.origin), op("+", op("*", c(self.width), y), x))


@dataclass(frozen=True)
class Grid:
    """A mask's image: rows of ``width`` tokens counted from position ``origin``."""

    origin: int
    width: int


def image_grid(mask: ir.ResolvedMask, normal: ir.NormalMask) -> Grid | str:
    """The image ``normal`` (the mask with its const parameters fixed, ``specialize``) reads positions on, or why
    it has none: the smallest constant divisor of a floor ``(p + c) // d`` or ``(p + c) % d`` of a position ``p``
    is the width, and ``-c`` (taken modulo the width if negative) the origin; every such floor must count rows
    from the same origin (offsets equal modulo the width). ``mask`` is checked for what a token order cannot
    rewrite: segments (laid out in raster positions) and a score modifier that reads positions."""
    if any(isinstance(n, (ir.SegAttr, ir.SegValue, ir.Same)) for r in mask.rules for n in nodes(r.cond)):
        return "it reads segments, which are laid out in raster positions"
    if mask.score is not None and _score_reads_positions(mask.score.expr):
        return "its score modifier reads positions"
    floors = []
    for region in normal.allow + normal.deny:
        for atom in region.atoms:
            for t in F.terms_of(atom.lin):
                if isinstance(t, ir.Floor) and L.is_const(t.den) and t.den.const > 1:
                    for p in (F.Q, F.K):
                        split = F.split_on(t.num, p)
                        if split is not None and split[0] == 1 and L.is_const(split[1]):
                            floors.append((t.den.const, split[1].const))
    if not floors:
        return "it reads no position through // or % by a constant (no image rows)"
    width = min(d for d, _ in floors)
    offsets = {c for d, c in floors if d == width}
    offset = max(offsets)
    if any((offset - c) % width for d, c in floors if d % width == 0):
        return f"its floors of positions count image rows of {width} from different origins"
    origin = -offset if offset <= 0 else (-offset) % width
    return Grid(origin, width)


def _score_reads_positions(expr) -> bool:
    if isinstance(expr, ir.ToFloat):
        return any(isinstance(n, (ir.Pos, ir.SegAttr, ir.SegValue)) for n in nodes(expr.value))
    if isinstance(expr, ir.FloatAt):
        return any(isinstance(n, (ir.Pos, ir.SegAttr, ir.SegValue)) for n in nodes(expr.index))
    if isinstance(expr, ir.FArith):
        return _score_reads_positions(expr.left) or _score_reads_positions(expr.right)
    if isinstance(expr, ir.FCall):
        return any(_score_reads_positions(a) for a in expr.args)
    return False


def candidates(grid: Grid, tile: int = 128) -> tuple[TokenOrder, ...]:
    """The orders worth trying on ``grid`` for tiles of ``tile`` tokens: for each band height of
    :data:`PATCH_ROWS`, patches as wide as the largest power of two that divides the width and keeps a patch
    within a tile (1: bands column by column). An order whose patches span whole rows is the raster order
    itself: left out."""
    out = []
    for rows in PATCH_ROWS:
        if rows * 1 > tile:
            continue
        cols = 1
        while grid.width % (2 * cols) == 0 and rows * 2 * cols <= tile:
            cols *= 2
        if cols < grid.width:
            out.append(TokenOrder(grid.origin, grid.width, rows, cols))
    return tuple(out)


def parse_order(name: str) -> tuple[int, int] | None:
    """``"8x16"`` -> (8, 16): the patch shape of ``Options(token_order=...)``; None for anything else."""
    rows, sep, cols = name.partition("x")
    if sep and rows.isdigit() and cols.isdigit() and int(rows) >= 1 and int(cols) >= 1:
        return int(rows), int(cols)
    return None
