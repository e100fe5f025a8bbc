"""Tile classes of masks with chunked regions from q-pieces: O(pieces x chunks), not O(rows x chunks).

A *piece* is a run of rows inside one q_block where every q-side form the regions read is affine in q:
pieces end at q_block starts, at the segment boundaries of the segments read at q, and wherever a floor
of q changes (``(q - text) // width`` is an image row: constant within a piece, and ``(q - text) % width``
is q plus a constant), and where a min or max of such forms changes its winner (a window clamped to
the image); then also where a guard that reads q changes truth (:func:`_guard_cuts`), so that every guard
holds at every row of a piece or at none. :func:`slopes_ok` checks this on the forms, with the further
conditions of :mod:`maskc.analysis.pieces`: every bound of one level has a slope in {-1, 0, 1} (0 where it is
divided), the lower bounds of a level all of one sign, the upper bounds too. Then, for one chunk tuple
``(J_n .. J_1)`` of one region, over a piece:

* every guard has one truth on the piece (the cuts where guards change truth), so the region's guards hold at
  every row or at none. Agreeing at the two end rows would not do for several guards: an affine guard that
  agrees at both ends agrees between, but a conjunction of them, an interval of rows (``q >= 5, q <= 9``),
  can be false at both ends and true between; :func:`~maskc.analysis.keys.enumerate_keys` flags a piece
  unless every guard holds at both end rows or one fails at both. Chunk ranges that agree at the two end
  rows are the same between (monotone bounds equal at both ends are constant);
* the key interval ``[lo(q), hi(q))`` has monotone ends and a concave width, so it is non-empty at every row
  when it is at both ends, and the union of the rows' intervals is the hull of the end rows' (consecutive
  rows shift by one key at most), their intersection the intersection of the end rows'.

Families (one per region, piece and chunk tuple) of one region lie in disjoint chunks. Families of one
piece whose hulls lie inside a family constant over the piece are dropped (a row sees them anyway); the
others must have disjoint hulls, and consecutive ones that abut at both end rows abut at every row (a
*chain*, whose intersection over the rows is exact again). A q_block is then touched where any of its
families' hulls reach, and covered where every piece has a chain covering. A family whose interval is
empty at one end only (an image's short last row) is kept as ``(piece, h0, h0, h1, h1)``, empty at both
ends as written, where its bounds are affine on the piece: ``[h0, h1)`` is the hull of its keys over the
rows where it is non-empty (:func:`_emptying_hulls`) and its intersection over the rows is empty, so it
touches its hull's blocks, covers none, joins no chain and is never constant (exact: at the rows where it is
empty no other family of its piece, their hulls disjoint from its own, holds a key of its hull). Elsewhere
such a piece is cut once where the interval empties (interpolated
from its bounds at the two ends) and its q_block's pieces found again: each part has its piece's chunk
tuples, and their bounds at the part's ends lie on the line through the piece's ends (affine), where the
piece's guards and chunk ranges agree (else the parts are enumerated again). Pieces that still break a
condition (ends that disagree, overlapping hulls, an interval empty at one end only) flag their q_block,
which the caller classifies row by row.

Where one region's families come as records of translates (:class:`~maskc.analysis.strided.StridedFamilies`: a
level-1 family's chunks, each interval its first one moved by ``j * stride`` keys), the records are classified
as they are when the families they stand for would pass every condition above with nothing covered
(:func:`_strided_runs`); else they are expanded into those families, by the enumeration's own code.
"""
from __future__ import annotations

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.analysis import strided
from maskc.analysis.keys import covered_by_all, enumerate_keys, nest_of, union
from maskc.analysis.strided import StridedFamilies
from maskc.runs import all_true, any_true, ceil_blocks, floor_blocks, sorted_unique
from maskc.analysis.formprog import Env, FormProgram
from maskc.analysis.rows import lin_value
from maskc.kernel_ir import FULL, PARTIAL


class Breaks:
    """Where pieces must end: floors of q as (sign, offset, divisor), segments read at q, min/max of
    forms of q with different slopes (innermost first: where their winner changes), and where guards
    ``lin <= 0`` that read q change truth: ``lines``, guards ``c*q + r`` (r free of rows) as (c, r), one
    row in all, and ``guards``, the others (affine on the pieces the rest make). :func:`slopes_ok` records
    the guards; :mod:`maskc.analysis.pieces` has cuts of its own for them."""

    def __init__(self):
        self.floors: set = set()
        self.segments: set = set()
        self.extremes: list = []
        self.lines: set = set()
        self.guards: list = []
        self._guard_program: FormProgram | None = None
        self._rounds: list | None = None

    def guard_program(self) -> FormProgram:
        """A program that evaluates the guards' forms, made once."""
        if self._guard_program is None:
            self._guard_program = FormProgram([(g, None) for g in self.guards])
        return self._guard_program

    def cut_rounds(self) -> list[tuple[FormProgram, tuple[tuple[int, ...], tuple[int, ...]]]]:
        """:func:`piece_starts`' rounds of cuts, made once: per extreme, innermost first, a program evaluating the
        forms whose crossings are cut, and the pairs of its outputs that may cross (:func:`_crossing_pairs`). The
        forms are its args, except that an arg which is another extreme plus a constant (a clamp's ``min(max(a, b),
        c)``) gives that extreme's forms, plus the constant, where every form is then free of extremes (so affine on
        the pieces the floors and segments make); a round is dropped where a later one cuts where it would (two
        forms cross where their difference changes sign: every difference of two of its forms is one of the later
        round's, up to sign). Cut where any two cross, the forms keep their order on each piece, and so every
        extreme over them its winner, in one round; where a crossing is not a winner's change the cut is an extra
        one (finer pieces, the same classes)."""
        if self._rounds is None:
            forms: dict = {}
            for extreme in self.extremes:
                flat = []
                for arg in extreme.args:
                    term = arg.terms[0][0] if len(arg.terms) == 1 and arg.terms[0][1] == 1 else None
                    inner = forms.get(term) if isinstance(term, ir.Extreme) else None
                    flat += [L.add(f, L.const(arg.const)) for f in inner] if inner is not None else [arg]
                if any(F.lin_mentions(f, lambda t: isinstance(t, ir.Extreme)) for f in flat):
                    flat = list(extreme.args)                      # the extremes inside cut first, in their rounds
                forms[extreme] = list(dict.fromkeys(flat))
            crossings = {e: {frozenset((L.sub(f, g), L.sub(g, f))) for i, f in enumerate(forms[e])
                             for g in forms[e][:i]} for e in self.extremes}
            kept = [e for i, e in enumerate(self.extremes)
                    if not any(crossings[e] <= crossings[later] for later in self.extremes[i + 1:])]
            self._rounds = [(FormProgram([(f, None) for f in forms[e]]), _crossing_pairs(forms[e])) for e in kept]
        return self._rounds


def _crossing_pairs(forms: list) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The pairs ``(i, j)``, ``i < j``, of ``forms`` (free of extremes, affine on each piece) that may cross on a
    piece, in order: all but those of one slope (one and the same on every piece: their difference is constant
    there, so never changes sign ahead). Two tuples."""
    slope = [slopes(f, Breaks()) or frozenset() for f in forms]
    found = [(i, j) for j in range(len(forms)) for i in range(j)
             if not (len(slope[i]) == 1 and slope[i] == slope[j])]
    found.sort()
    return tuple(i for i, _ in found), tuple(j for _, j in found)


def _free_of_rows(lin: ir.Lin) -> bool:
    return not F.depends_on_q(lin) and not F.lin_mentions(lin, lambda t: isinstance(t, ir.ChunkVar))


def _term_slopes(t, breaks: Breaks) -> frozenset | None:
    if t == F.Q:
        return frozenset({1})
    if isinstance(t, (ir.Builtin, ir.ParamRef, ir.ChunkVar)):
        return frozenset({0})
    if isinstance(t, (ir.SegAttr, ir.SegValue)):
        if t.pos != "q":
            return None
        breaks.segments.add(t.seg)
        return frozenset({0})
    if isinstance(t, ir.Floor):
        split = F.split_on(t.num, F.Q)
        if split is not None and split[0] in (1, -1) and _free_of_rows(split[1]) and _free_of_rows(t.den):
            breaks.floors.add((split[0], split[1], t.den))
            return frozenset({0 if t.op == "//" else split[0]})
    found = [slopes(lin, breaks) for lin in F.inner_lins(t)]
    inner = [s for s in found if s is not None]
    if len(inner) < len(found):
        return None
    if isinstance(t, ir.Extreme) and not F.lin_mentions(L.of_term(t), lambda u: isinstance(u, ir.ChunkVar)):
        if any(s != {0} for s in inner) and t not in breaks.extremes:
            breaks.extremes.append(t)          # after the extremes inside it
        return frozenset().union(*inner)
    return frozenset({0}) if all(s == {0} for s in inner) else None


def slopes(lin: ir.Lin, breaks: Breaks) -> frozenset | None:
    """The slopes ``lin`` may have in q within a piece (None where it is not affine there); records the
    breaks that make it affine."""
    total = {0}
    for t, c in lin.terms:
        s = _term_slopes(t, breaks)
        if s is None:
            return None
        total = {a + c * b for a in total for b in s}
    return frozenset(total)


def slopes_ok(regions, breaks: Breaks) -> bool:
    """Whether every region's forms meet the piece conditions (module docstring)."""
    for region in regions:
        nest = nest_of(region)
        for g in region.guards + region.static_guards + nest.guards:
            s = slopes(g.lin, breaks)
            if s is None:
                return False
            if s == {0}:
                continue                             # one truth on every piece
            line = F.split_on(g.lin, F.Q)
            if line is not None and line[0] != 0 and _free_of_rows(line[1]):
                breaks.lines.add(line)
            elif g.lin not in breaks.guards:
                breaks.guards.append(g.lin)
        for level in nest.levels:
            for bounds in (level.lower, level.upper):
                signs: set = set()
                for b in bounds:
                    s = slopes(b.lin, breaks)
                    if s is None or any(abs(x) > 1 for x in s) or (s != {0} and b.den != 1):
                        return False
                    signs |= s
                if len(signs - {0}) > 1:
                    return False
    return True


def last_rows(starts: np.ndarray, end: int) -> np.ndarray:
    """The last row of each piece that begins at ``starts`` (ascending), the last one ending before ``end``."""
    out = np.empty_like(starts)
    out[:-1] = starts[1:]
    out[-1:] = end
    return out - 1


def piece_starts(breaks: Breaks, params, b: int, head: int, seq_len: int, kv_len: int, block_m: int | None,
                 rows: tuple[int, int] | None = None):
    """The first row of every piece (of the rows ``[row0, row1)``, whole q_blocks, when given); with ``block_m``
    None, of the pieces the breaks alone make (not cut at q_block starts). A cut at a q_block start is one the
    q_block starts make already: a floor stepping at q_block starts only (clear's image rows at block_m = the
    width) and a guard line changing truth at one add nothing, and where nothing else cuts, the q_block starts
    are the pieces (no sort)."""
    row0, row1 = rows or (0, seq_len)
    aligned = block_m if block_m and row0 % block_m == 0 else 0      # the q_block size, where rows start q_blocks
    parts = [np.arange(row0, row1, block_m, dtype=np.int64) if block_m else np.array([row0], np.int64)]
    for seg in sorted(breaks.segments):
        parts.append(params.segment(seg).bounds)
    for sign, offset, den in breaks.floors:
        r = lin_value(offset, params, seq_len, kv_len, head, b)
        d = lin_value(den, params, seq_len, kv_len, head, b)
        first = (-r) % d if sign > 0 else (r + 1) % d        # where (sign*q + r) // d steps
        if aligned and d > 0 and d % aligned == 0 and first % aligned == 0:
            continue                                          # every step a q_block start
        parts.append(np.arange(first + max(0, -(-(row0 - first) // d)) * d, row1, d, dtype=np.int64))
    if breaks.lines:                     # c*q + r <= 0 changes truth once: past -r/c (c > 0), at r/-c (c < 0)
        values = [(c, lin_value(r, params, seq_len, kv_len, head, b)) for c, r in breaks.lines]
        at = [-r // c + 1 if c > 0 else -(r // c) for c, r in values]
        at = [x for x in at if not (aligned and x % aligned == 0)]
        if at:
            parts.append(np.array(at, np.int64))
    if len(parts) == 1 and block_m:
        return _crossings_and_guards(breaks, parts[0], row1, params, b, head, seq_len, kv_len)
    starts = sorted_unique(np.concatenate(parts), runs=True)
    starts = starts[(starts >= row0) & (starts < row1)]
    return _crossings_and_guards(breaks, starts, row1, params, b, head, seq_len, kv_len)


def _crossings_and_guards(breaks: Breaks, starts: np.ndarray, row1: int, params, b: int, head: int, seq_len: int,
                          kv_len: int) -> np.ndarray:
    """:func:`piece_starts`' last steps: ``starts`` (ascending, in range) cut where the breaks' forms cross and where
    their guards change truth."""
    for program, pairs in breaks.cut_rounds():  # forms affine on each piece: cut where two of them cross
        starts = _crossing_cuts(program, pairs, starts, row1, params, b, head, seq_len, kv_len)
    if breaks.guards:
        starts = _guard_cuts(breaks, starts, row1, params, b, head, seq_len, kv_len)
    return starts


def _crossing_cuts(program: FormProgram, pairs: tuple[tuple[int, ...], tuple[int, ...]], starts: np.ndarray, row1: int,
                   params, b: int, head: int, seq_len: int, kv_len: int) -> np.ndarray:
    """``starts`` (ascending, the pieces ending before ``row1``) with, for every pair ``(i, j)`` of ``pairs`` (of the
    ``program``'s outputs, forms affine on each piece) whose difference ``d`` changes sign ahead on a piece, the row
    ``start - d0 // step`` (``d0`` its value at the piece's first row, ``step`` its change to the second) where that
    lies in the piece. Pair by pair: stacking the pairs into one array took more numpy calls than it saved (session
    23: the few pieces make every call cost what a call costs)."""
    n = len(starts)
    ends = last_rows(starts, row1)
    rows = np.concatenate([starts, np.minimum(starts + 1, ends)])          # each piece's first and second rows
    at_rows = program.run(Env(params, seq_len, kv_len, head, b, rows))
    cuts = [starts]
    for i, j in zip(*pairs):
        d = at_rows[i] - at_rows[j]
        if not np.ndim(d):
            continue                                    # two constants never cross
        d0 = d[:n]
        step = d[n:] - d0
        ahead = (d0 * step < 0).nonzero()[0]            # crossing ahead (so step != 0: // is safe)
        if len(ahead):
            at = starts.take(ahead) - d0.take(ahead) // step.take(ahead)  # the first row past the crossing
            cuts.append(at[at <= ends.take(ahead)])
    return sorted_unique(np.concatenate(cuts), runs=True) if len(cuts) > 1 else starts   # each piece's cuts ascend


def _guard_cuts(breaks: Breaks, starts: np.ndarray, row1: int, params, b: int, head: int, seq_len: int,
                kv_len: int) -> np.ndarray:
    """``starts`` (pieces ending before ``row1``) with the rows added where a guard ``g <= 0`` of ``breaks``
    changes truth: the guards are affine on the pieces (the other breaks made them so), so each changes once at
    most on a piece, at a row found from its values at the piece's first two rows. Then every guard holds at
    every row of a piece or at none. (Their conjunction, an interval of rows, can be false at both ends of a
    piece and true between: ``q == 1000`` is ``q <= 1000`` and ``q >= 1000``.)"""
    n = len(starts)
    ends = last_rows(starts, row1)
    env = Env(params, seq_len, kv_len, head, b, np.concatenate([starts, np.minimum(starts + 1, ends)]))
    cuts = [starts]
    for v in breaks.guard_program().run(env):
        if not np.ndim(v):
            continue                                    # the same at every row
        g0 = v[:n]
        step = v[n:] - g0
        up, down = np.maximum(step, 1), np.maximum(-step, 1)
        # rows from the start to the first of the other truth: g rising past 0 from g0 <= 0, or falling to 0 from g0 > 0
        t = np.where(step > 0, np.where(g0 <= 0, (-g0) // up + 1, 0),
                     np.where((step < 0) & (g0 > 0), (g0 + down - 1) // down, 0))
        change = (t > 0) & (starts + t <= ends)
        if any_true(change):
            cuts.append(starts[change] + t[change])
    return sorted_unique(np.concatenate(cuts), runs=True) if len(cuts) > 1 else starts


def piece_runs(regions, breaks: Breaks, make, params, b: int, head: int, seq_len: int, kv_len: int,
               block_m: int, block_n: int, budget: int):
    """Tile runs ``(q_block, kv_begin, kv_end, kind)`` of the allow ``regions``' union, exact on every q_block
    not flagged in ``bad`` (bool[QT]; those have no runs here), sorted by q_block and kv_begin, none empty, and
    ``bad``. See the module docstring; a column (:func:`_column_apart`) joins the other families' blocks at the
    end."""
    qt, kt = -(-seq_len // block_m), -(-kv_len // block_n)
    starts = piece_starts(breaks, params, b, head, seq_len, kv_len, block_m)
    ends = last_rows(starts, seq_len)
    # One region's families in runs of translates (video's image rows) are classified as runs where that is
    # simple; else they are expanded into the families below.
    first = enumerate_keys(regions[0], make, [starts, ends], kv_len, budget,
                           records=strided.records if len(regions) == 1 else None)
    if isinstance(first, StridedFamilies):
        found = _strided_runs(first, starts, seq_len, kv_len, block_m, block_n)
        if found is not None:
            return found
        first = first.expand()
    parts, bad_piece, cuts, budget, enumerated = _families(regions, make, starts, ends, kv_len, budget, first)
    column, ordered = (None, None) if len(cuts) else _column_apart(parts, len(starts), kv_len)
    if column is None:
        families = _joined(parts)
        if len(cuts):
            starts, ends, families, bad_piece = _cut(regions, make, starts, ends, families, bad_piece, cuts, kv_len,
                                                     block_m, budget, enumerated)
        # One region's come sorted, usually all kept; several regions' whose pieces interleave (clear's) are out
        # of hull order for certain: no check (a choice of path only: the drop keeps what _nothing_covered passes)
        interleaved = any(len(a[0]) and len(b[0]) and a[0][-1] > b[0][0] for a, b in zip(enumerated, enumerated[1:]))
        ordered = None if interleaved else _hull_order(families, kv_len, sort=False)
        if ordered is None or not _nothing_covered(*ordered):
            piece, la, ha, lb, hb = families
            ordered = _hull_order(_drop_covered(piece, la, ha, lb, hb, kv_len), kv_len)
    block = starts // block_m
    assert ordered is not None
    (piece, la, ha, lb, hb), h0, h1, same = ordered
    bad = np.zeros(qt, bool)
    if not len(piece):                           # no row of any piece sees a key
        bad[block[bad_piece]] = True
        return (np.zeros(0, np.int64),) * 4, bad
    over = same & (h0[1:] < h1[:-1])                                    # hulls of two families overlap
    if any_true(over):                                                  # (usual: none)
        bad_piece[piece[1:][over]] = True
    joined = ha[:-1] == la[1:]                  # abuts the previous at both ends (usual: nowhere at the first)
    if any_true(joined):
        joined &= same & (hb[:-1] == lb[1:])
    if any_true(joined):
        first = np.concatenate([[0], (~joined).nonzero()[0] + 1])
        last = last_rows(first, len(piece))
        c_piece, c_lo, c_hi = piece[first], np.maximum(la[first], lb[first]), np.minimum(ha[last], hb[last])
    else:                                                                 # every family a chain of its own
        c_piece, c_lo, c_hi = piece, np.maximum(la, lb), np.minimum(ha, hb)
    # A chain covers a key block only if it keeps block_n keys at every row (or reaches kv_len: the short last
    # tile): the others, most where families are narrower than a block, leave before their blocks are found.
    wide = (c_hi >= np.minimum(c_lo + block_n, kv_len)).nonzero()[0]       # block_n keys, or up to kv_len
    c_piece, c_lo, c_hi = c_piece[wide], c_lo[wide], c_hi[wide]
    bad[block[bad_piece]] = True
    # Touched key blocks: the union of the families' hulls, piece by piece (in order already: no sort), then
    # q_block by q_block; covered: those every piece's chains cover.
    if any_true(bad):
        ok = ~bad[block[piece]]
        piece, h0, h1, same = piece[ok], h0[ok], h1[ok], None
    by_piece = _touched_blocks(piece, h0, h1, block_n, same)
    # a piece a q_block (clear's): its touched blocks are the q_block's already (union's form), its chains' blocks,
    # disjoint, what it covers. (The pieces include every q_block start: one a q_block where there are qt.)
    alone = len(starts) == qt
    touched = (block[by_piece[0]], by_piece[1], by_piece[2])
    k0, k1 = ceil_blocks(c_lo, block_n), np.where(c_hi >= kv_len, kt, floor_blocks(c_hi, block_n))
    ok = k0 < k1
    if any_true(bad):
        ok &= ~bad[block[c_piece]]
    cover = c_piece[ok], k0[ok], k1[ok]
    if column is not None:
        # the column's blocks: touched, and covered where whole (it is a chain of its own: none abuts it)
        p, lo, hi = column
        if any_true(bad):
            keep = ~bad[block[p]]
            p, lo, hi = p[keep], lo[keep], hi[keep]
        touched = union(np.concatenate([touched[0], block[p]]), np.concatenate([touched[1], floor_blocks(lo, block_n)]),
                        np.concatenate([touched[2], ceil_blocks(hi, block_n)]), kt)
        k0, k1 = ceil_blocks(lo, block_n), np.where(hi >= kv_len, kt, floor_blocks(hi, block_n))
        if alone and not len(cover[0]):
            # the column's whole blocks alone (clear's: no chain of its disc keeps a block): its intervals are
            # union's (sorted, disjoint, a key apart at least), so their whole blocks ascend a block apart at least,
            # as union would return them but for the empty ones (one piece a q_block: the rows ascend too)
            whole = (k0 < k1).nonzero()[0]
            return _split_at_covered(touched, (block[p[whole]], k0[whole], k1[whole]), kt), bad
        cover = np.concatenate([cover[0], p]), np.concatenate([cover[1], k0]), np.concatenate([cover[2], k1])
        if not alone:          # a piece's chains inside its column cover its blocks twice: counted once
            cover = union(*cover, kt)
    elif not alone:
        touched = union(*touched, kt)
    if alone:
        covered = union(block[cover[0]], cover[1], cover[2], kt)
    else:
        covered = covered_by_all(block[cover[0]], cover[1], cover[2], np.bincount(block, minlength=qt), kt)
    return _split_at_covered(touched, covered, kt), bad


def _strided_runs(families: StridedFamilies, starts, seq_len: int, kv_len: int, block_m: int, block_n: int):
    """:func:`piece_runs`' answer for one region whose families come as records of translates
    (:class:`~maskc.analysis.strided.StridedFamilies`), or None where it is not simply found from the records.

    It is, where the families of the records, expanded, would take piece_runs' path with nothing dropped,
    flagged or covered: in hull order with disjoint hulls within each piece (each record's members apart: hull
    width at most the stride; each record starting at or after the previous one's last member ends), no chain
    (no member abutting the next at both end rows; then no two constant ones touch either, and
    :func:`_nothing_covered` holds), none keeping block_n keys at every row, and none reaching kv_len whose
    keys at every row hold a block's start before the last block (so none covers a block; only a record's last
    member can reach kv_len: the next one, past it, would be empty). Then the runs are the touched blocks
    (:func:`_touching_hulls`), PARTIAL. Peeled members empty at one end or both are taken as :func:`_families` takes
    such families (:func:`_settled_peeled`)."""
    qt, kt = -(-seq_len // block_m), -(-kv_len // block_n)
    piece, count, stride = families.owner, families.count, families.stride
    (la, lb), (ha, hb) = families.lo, families.hi
    if not all_true((la < ha) & (lb < hb)):                   # peeled members clamped empty (a short last image row)
        settled = _settled_peeled(piece, la, ha, lb, hb, count, stride)
        if settled is None:
            return None
        piece, la, ha, lb, hb, count, stride = settled
    h0, h1 = np.minimum(la, lb), np.maximum(ha, hb)
    span = stride * (count - 1)                              # from a record's first member to its last
    same = piece[1:] == piece[:-1]
    many = count > 1
    c_lo, c_hi = np.maximum(la, lb), np.minimum(ha, hb)     # a member's keys at every row of its piece
    # The overlap tests hold by construction (one region's families lie in distinct chunks, each interval inside
    # its chunk), as piece_runs' own test does; kept, two operations each, since the cover test leans on them.
    if (any_true(same & (h0[1:] < h1[:-1] + span[:-1]))                                # records overlap
            or any_true(many & (h1 - h0 > stride))                                     # members overlap
            or any_true(many & (ha - la == stride) & (hb - lb == stride))              # members chain
            or any_true(same & (ha[:-1] + span[:-1] == la[1:]) & (hb[:-1] + span[:-1] == lb[1:]))   # records chain
            or any_true(c_hi - c_lo >= block_n)                                         # may cover a block
            or any_true((c_hi + span >= kv_len) & (ceil_blocks(c_lo + span, block_n) < kt))):  # covers the last
        return None
    block = starts // block_m
    bad = np.zeros(qt, bool)
    bad[block[families.unsure]] = True
    if not len(piece):                           # no row of any piece sees a key
        return (np.zeros(0, np.int64),) * 4, bad
    if any_true(bad):
        ok = ~bad[block[piece]]
        piece, h0, h1, count, stride = piece[ok], h0[ok], h1[ok], count[ok], stride[ok]
    several = len(starts) > qt                   # pieces a q_block (each q_block starts one): unioned per q_block below
    apart = several and len(stride) and stride.max() > block_n
    if apart:
        # members that may lie apart are listed one by one below (_touching_hulls): fewer records, fewer members.
        # (A stride of at most block_n gives one hull a record already: nothing to gain, video's.)
        piece, h0, h1, count, stride = _merged_in_q_blocks(piece, h0, h1, count, stride, block)
    piece, h0, h1 = _touching_hulls(piece, h0, h1, count, stride, block_n)
    if several and not apart:
        # one hull a record: the union per q_block of their blocks is that of each piece's (_touched_blocks',
        # then unioned), in one step (video: 170 -> 149 us). Members listed one by one (NATTEN's) come out of
        # order across a q_block's pieces: merged per piece first, the union sorts fewer (one step: 237 -> 256).
        touched = union(block[piece], floor_blocks(h0, block_n), ceil_blocks(h1, block_n), kt)
    else:
        by_piece = _touched_blocks(piece, h0, h1, block_n)
        touched = (block[by_piece[0]], by_piece[1], by_piece[2])
        if several:
            touched = union(*touched, kt)
    empty = np.zeros(0, np.int64)
    return _split_at_covered(touched, (empty, empty, empty), kt), bad


def _settled_peeled(piece, la, ha, lb, hb, count, stride):
    """The records (:func:`_strided_runs`' arrays) with their members empty at one end or both (peeled, records of
    one) taken as :func:`_families` takes such families where their width is monotone (lo and hi moving in
    opposite directions between the ends, or staying: :func:`~maskc.analysis.keys.enumerate_keys`' ``monotone``):
    empty at both ends, dropped (empty between); at one end, kept as ``(h0, h0, h1, h1)``, its interval ``[h0, h1)``
    at the other end (:func:`_emptying_hulls`: it narrows towards the empty end). None where one is not monotone
    (then the families go through :func:`_families`, which reads their bounds)."""
    live_a, live_b = la < ha, lb < hb
    empty = (~(live_a & live_b)).nonzero()[0]
    if any_true((lb[empty] - la[empty]) * (hb[empty] - ha[empty]) > 0):
        return None
    narrows = empty[live_a[empty] != live_b[empty]]
    h0 = np.where(live_a[narrows], la[narrows], lb[narrows])
    h1 = np.where(live_a[narrows], ha[narrows], hb[narrows])
    la, ha, lb, hb = la.copy(), ha.copy(), lb.copy(), hb.copy()
    la[narrows], ha[narrows], lb[narrows], hb[narrows] = h0, h0, h1, h1
    keep = np.ones(len(piece), bool)
    keep[empty[live_a[empty] == live_b[empty]]] = False       # empty at both ends
    return piece[keep], la[keep], ha[keep], lb[keep], hb[keep], count[keep], stride[keep]


def _merged_in_q_blocks(piece, h0, h1, count, stride, block):
    """The records (:func:`_strided_runs`' arrays: sorted by piece, hulls ``[h0, h1)`` non-empty; ``block`` the
    q_block of each piece) with runs of consecutive ones merged where that leaves the blocks each q_block's
    members touch as they were: records of one q_block, each the only record of its piece, of equal ``count`` and
    ``stride``, whose hulls overlap or abut one after the other. Their member j's hulls are then one translate
    (``j * stride``) of hulls that chain, so their union is one interval, member j of a record whose hull is the
    union of theirs ([least h0, greatest h1)), and the blocks a union of intervals touches are those its
    intervals touch. The merged record takes its first one's piece (the others' pieces lose their only record:
    their q_block's touched blocks are found from its other pieces'); a piece with several records keeps them as
    they are, in the hull order :func:`_touched_blocks` leans on. For the caller's union per q_block only (a
    piece's own blocks change). NATTEN at 32K: 811 records, 797 pieces, 256 q_blocks -> 290 records."""
    n = len(piece)
    if n < 2:
        return piece, h0, h1, count, stride
    starts_piece = np.empty(n + 1, bool)                 # whether each record starts its piece (and an end mark)
    starts_piece[0] = starts_piece[n] = True
    np.not_equal(piece[1:], piece[:-1], out=starts_piece[1:n])
    alone = starts_piece[:-1] & starts_piece[1:]         # the only record of its piece
    q_block = block[piece]
    join = alone[1:] & alone[:-1]                        # record i + 1 merged into the run of record i
    join &= q_block[1:] == q_block[:-1]
    join &= h0[1:] <= h1[:-1]
    join &= h0[:-1] <= h1[1:]
    join &= count[1:] == count[:-1]
    join &= stride[1:] == stride[:-1]
    if not any_true(join):
        return piece, h0, h1, count, stride
    first = np.concatenate([[0], (~join).nonzero()[0] + 1])
    return (piece[first], np.minimum.reduceat(h0, first), np.maximum.reduceat(h1, first), count[first],
            stride[first])


def _touching_hulls(piece, h0, h1, count, stride, block_n: int):
    """``(piece, h0, h1)``: hulls whose blocks are those the records' members touch (member j's hull ``[h0 + j *
    stride, h1 + j * stride)``), in hull order: a record's hull of hulls where its members' blocks are contiguous
    (a stride at most block_n moves a member's first block by one at most; one at most the hull width starts the
    next member inside the previous one's hull), else each member's hull (NATTEN's 181-key image rows, 13 keys
    seen in each, apart by more than a block)."""
    apart = (count > 1) & (stride > np.maximum(h1 - h0, block_n))
    if not any_true(apart):
        return piece, h0, h1 + stride * (count - 1)
    times = np.where(apart, count, 1)                            # the hulls each record gives
    shift = (np.arange(int(times.sum())) - np.repeat(times.cumsum() - times, times)) * np.repeat(stride, times)
    last = np.where(apart, h1, h1 + stride * (count - 1))         # one hull: to the last member's end
    return np.repeat(piece, times), np.repeat(h0, times) + shift, np.repeat(last, times) + shift


def _column_apart(parts, pieces: int, kv_len: int):
    """``(column, ordered)``: where all regions but one have families constant over their piece (a *column*:
    keys free of q, as clear's ``q < text`` and ``k < text``), the union of those ``(piece, lo, hi)`` (sorted by
    piece and lo, disjoint, not adjacent) and the other region's families in hull order (:func:`_hull_order`), if
    none of those crosses an end of a column interval of its piece or abuts one at both end rows
    (:func:`_apart`); else ``(None, None)``.

    Then a row's keys are its piece's column intervals and the families' intervals, and no block is covered by a
    column interval and a family together, only by one of them or by a chain of families (one across the
    interval's end at every row would abut it at both end rows, or cross it): the column's blocks join the
    others' at the end, touched and covered, instead of its families going through the drop. Families inside a
    column interval stay (what they touch and cover, it does); one region's families lie in disjoint chunks, so
    none lies inside another (constant ones that touch join as a chain, as the drop would merge them).
    Only regions with at most one family a piece on average are tested for constancy (four operations on
    each): a large region is taken to be no column."""
    column = [i for i, (owner, la, ha, lb, hb) in enumerate(parts)      # (one array for both points: constant)
              if 0 < len(owner) <= pieces and ((la is lb and ha is hb) or all_true((la == lb) & (ha == hb)))]
    if not column or len(parts) - len(column) != 1:
        return None, None
    found = _keyed_hull_order(next(part for i, part in enumerate(parts) if i not in column), kv_len, sort=False)
    if found is None or not len(found[0][1]):
        return None, None
    ordered, key = found
    piece, lo, hi = (np.concatenate([parts[i][j] for i in column]) for j in range(3))
    c_piece, c_lo, c_hi = union(piece, lo, hi, kv_len)
    if not _apart(ordered, key, c_piece, c_lo, c_hi, kv_len):
        return None, None
    return (c_piece, c_lo, c_hi), ordered


def _apart(ordered, key, c_piece, c_lo, c_hi, kv_len: int) -> bool:
    """Whether no family of ``ordered`` (:func:`_hull_order`, ``key`` its order's key: :func:`_keyed_hull_order`;
    hulls disjoint within a piece where it is not flagged) has a hull across an end of a column interval
    ``[c_lo, c_hi)`` of its piece (sorted by ``c_piece`` and ``c_lo``, disjoint), and none abuts one at both of its
    piece's end rows (its high ends at ``c_lo``, or its low ends at ``c_hi``). Per column, by search: the last
    family starting before it (across its start if it ends past it; abutting if both high ends are its start), the
    last one starting before its end (across that end if it ends past it), the one after (abutting if both low ends
    are its end)."""
    (piece, la, ha, lb, hb), h0, h1, _ = ordered
    base = c_piece * (kv_len + 1)
    n = len(key)
    before = key.searchsorted(base + c_lo) - 1
    inside = key.searchsorted(base + c_hi) - 1
    after = inside + 1
    b, i, a = np.maximum(before, 0), np.maximum(inside, 0), np.minimum(after, n - 1)
    b_here = (before >= 0) & (piece[b] == c_piece)
    i_here = (inside >= 0) & (piece[i] == c_piece)
    a_here = (after < n) & (piece[a] == c_piece)
    across = (b_here & (h1[b] > c_lo)) | (i_here & (h1[i] > c_hi))
    abuts = (b_here & (ha[b] == c_lo) & (hb[b] == c_lo)) | (a_here & (la[a] == c_hi) & (lb[a] == c_hi))
    return not any_true(across | abuts)


def _split_at_covered(touched, covered, kt: int):
    """Runs ``(q_block, begin, end, kind)`` of the ``touched`` key blocks, FULL where ``covered`` and PARTIAL
    elsewhere, sorted by q_block and begin, none empty, where every covered range lies inside a touched one
    (both as :func:`~maskc.analysis.keys.union` returns them: sorted, disjoint, not adjacent).

    Then a touched range's boundaries and those of the covered ranges inside it, in key order, are its start,
    each covered range's start and end, its end (a covered range may start at its start or end at its end):
    one stable sort of the four lists (in that order, for those ties) gives every run in order, each from one
    boundary to the next, FULL from a covered start, PARTIAL from a touched start or a covered end, none from
    a touched end (the gap to the next range)."""
    t_row, t_lo, t_hi = touched
    if not len(covered[0]):
        return t_row, t_lo, t_hi, np.full(len(t_row), PARTIAL)
    c_row, c_lo, c_hi = covered
    stride = kt + 1
    t_base, c_base = t_row * stride, c_row * stride
    at = np.concatenate([t_base + t_lo, c_base + c_lo, c_base + c_hi, t_base + t_hi])
    order = at.argsort(kind="stable")
    at = at[order]
    n, m = len(t_row), len(c_row)
    role = np.empty(len(at), np.int64)          # the run a boundary starts, by the list it came from
    role[:n] = PARTIAL
    role[n:n + m] = FULL
    role[n + m:n + 2 * m] = PARTIAL
    role[n + 2 * m:] = -1
    role = role[order]
    run = ((role[:-1] >= 0) & (at[1:] > at[:-1])).nonzero()[0]
    row = at[run] // stride
    return row, at[run] - row * stride, at[run + 1] - row * stride, role[run]


def _touched_blocks(piece: np.ndarray, h0: np.ndarray, h1: np.ndarray, block_n: int, same: np.ndarray | None = None):
    """Per piece, the key blocks that its families' hulls ``[h0, h1)`` touch, as :func:`union` of the hulls'
    blocks returns them (ascending, disjoint, non-adjacent ranges), for families in hull order
    (:func:`_hull_order`) whose non-empty hulls are disjoint within each piece (what :func:`piece_runs` keeps).
    Then a piece's hulls ascend at both ends, so do their blocks: a range begins where the piece changes or
    a family's first block lies past the previous family's last, and ends at its last family's. No sort and
    no running maximum, which :func:`union` must allow for. ``same``: ``piece[1:] == piece[:-1]`` where the
    caller has it (the hull order's)."""
    first_block, end_block = floor_blocks(h0, block_n), ceil_blocks(h1, block_n)
    new = np.empty(len(piece), bool)
    new[:1] = True
    np.greater(first_block[1:], end_block[:-1], out=new[1:])
    new[1:] |= (piece[1:] != piece[:-1]) if same is None else ~same
    first = new.nonzero()[0]
    return piece[first], first_block[first], end_block[last_rows(first, len(piece))]


def _families(regions, make, starts, ends, kv_len: int, budget: int, first=None):
    """The families of the pieces ``[starts, ends]``, one part per region (``(piece, lo, hi)`` at the start row,
    ``(lo, hi)`` at the end row: those non-empty at both, and those that empty inside their piece as ``(piece,
    h0, h0, h1, h1)``: module docstring; :func:`_joined` makes one of them), which pieces break a condition, the
    rows where cutting such a piece may mend it (:func:`~maskc.analysis.keys.enumerate_keys`' ``cut``), the
    budget left, and each region's enumeration as it came (the first region's ``first`` where given)."""
    bad_piece = np.zeros(len(starts), bool)
    parts, cuts, enumerated = [], [], []
    for i, region in enumerate(regions):
        found = first if i == 0 and first is not None else enumerate_keys(region, make, [starts, ends], kv_len, budget)
        enumerated.append(found)
        owner, lo, hi, unsure, blind, cut, _ = found
        budget -= len(owner)
        bad_piece |= unsure
        empty = found[-1].empty                     # the families empty at one end at least (few)
        if not len(empty):                          # usual: nothing to drop, no cut proposed (cut < 0 throughout)
            parts.append((owner, lo[0], hi[0], lo[1], hi[1]))
            continue
        emptying, h0, h1 = _emptying_hulls(found, starts, ends)
        hull = np.zeros(len(empty), bool)
        hull[empty.searchsorted(emptying)] = True
        dead = (lo[0][empty] >= hi[0][empty]) & (lo[1][empty] >= hi[1][empty]) & blind[empty]
        bad_piece[owner[empty[~dead & ~hull]]] = True
        dropped = empty[~hull]
        keep = np.ones(len(owner), bool)
        keep[dropped] = False
        la, ha, lb, hb = lo[0][keep], hi[0][keep], lo[1][keep], hi[1][keep]
        at = emptying - dropped.searchsorted(emptying)     # in place: a piece's families stay in hull order, usually
        la[at], ha[at], lb[at], hb[at] = h0, h0, h1, h1
        parts.append((owner[keep], la, ha, lb, hb))
        proposed = cut[dropped]
        cuts.append(proposed[proposed >= 0])
    return parts, bad_piece, np.concatenate(cuts) if cuts else np.zeros(0, np.int64), budget, enumerated


def _joined(parts):
    """The families of several regions' ``parts`` as one (in the regions' order)."""
    return parts[0] if len(parts) == 1 else tuple(np.concatenate(x) for x in zip(*parts))


def _emptying_hulls(found, starts, ends):
    """``(family, h0, h1)``, ascending by family: of one region's enumeration ``found`` on the pieces ``[starts,
    ends]``, the families non-empty at one end of their piece only whose keys over the piece's rows are known,
    and the hull ``[h0, h1)`` of those keys.

    Where the family's width is monotone (:class:`~maskc.analysis.keys.EndBounds`' ``monotone``) it narrows
    towards its empty end: the hull is its interval at the other. Elsewhere, where its level-0 bounds are affine
    on the piece (their change over the piece a multiple of its length, as :func:`_parts_by_interpolation`
    asks), its rows run from the non-empty end to the row next to its ``cut`` (where its interval empties,
    :func:`~maskc.analysis.keys.enumerate_keys`): an interval with monotone ends is non-empty between two rows
    where it is, and consecutive rows' intervals meet (module docstring), so the keys are the hull of the
    intervals at the non-empty end and at that row, the latter on the line through the piece's ends."""
    owner, lo, hi, _, _, cut, bounds = found
    empty = bounds.empty
    first_live = lo[0][empty] < hi[0][empty]
    narrows = (bounds.monotone & (first_live != (lo[1][empty] < hi[1][empty]))).nonzero()[0]
    live = first_live[narrows]
    parts = [(empty[narrows], np.where(live, lo[0][empty[narrows]], lo[1][empty[narrows]]),
              np.where(live, hi[0][empty[narrows]], hi[1][empty[narrows]]))]
    with_cut = (cut[bounds.pending] >= 0).nonzero()[0] if len(bounds.pending) else []
    if len(with_cut):
        family = bounds.pending[with_cut]
        lows_a, highs_a, lows_b, highs_b = (v[:, with_cut] for v in bounds.of_pending)
        a, b = np.concatenate([lows_a, highs_a]), np.concatenate([lows_b, highs_b])     # [bounds, families]
        start = starts[owner[family]]
        span = ends[owner[family]] - start                 # > 0: a cut lies in (start, end]
        slope = (b - a) // span
        affine = (slope * span == b - a).all(axis=0)
        first_live = lo[0][family] < hi[0][family]
        near = np.where(first_live, cut[family] - 1, cut[family])          # the non-empty row next to the cut
        at_near = a + slope * (near - start)
        n = len(lows_a)
        near_lo, near_hi = at_near[:n].max(axis=0), at_near[n:].min(axis=0) + 1
        end_lo = np.where(first_live, lo[0][family], lo[1][family])
        end_hi = np.where(first_live, hi[0][family], hi[1][family])
        ok = affine & (near_lo < near_hi)
        parts.append((family[ok], np.minimum(end_lo, near_lo)[ok], np.maximum(end_hi, near_hi)[ok]))
    if len(parts) == 1:
        return parts[0]
    family, h0, h1 = (np.concatenate(x) for x in zip(*parts))
    order = family.argsort()
    return family[order], h0[order], h1[order]


def _cut(regions, make, starts, ends, families, bad_piece, cuts, kv_len: int, block_m: int, budget: int,
         enumerated):
    """The pieces of the q_blocks where :func:`_families` proposed cuts, cut there and their families found
    again (once: parts that still break a condition stay flagged), from the pieces' ``enumerated`` bounds
    where :func:`_parts_by_interpolation` can, else enumerated again; the other pieces and their families
    kept. Pieces come back renumbered (the cut ones last), not in row order."""
    block = starts // block_m
    flagged = np.zeros(int(block[-1]) + 1, bool)          # the q_blocks of the cuts (rows inside the pieces)
    flagged[cuts // block_m] = True
    again = flagged[block]
    new_starts = sorted_unique(np.concatenate([starts[again], cuts]))
    whole = starts.searchsorted(new_starts, side="right") - 1        # the piece each part was cut from
    new_ends = np.minimum(ends[whole], last_rows(new_starts, ends[-1] + 1))
    found = _parts_by_interpolation(enumerated, starts, ends, new_starts, new_ends, whole, budget)
    if found is None:
        parts, new_bad, _, _, _ = _families(regions, make, new_starts, new_ends, kv_len, budget)
        found = _joined(parts)
    else:
        found, new_bad = found
    keep = ~again
    renumber = keep.cumsum() - 1
    old = keep[families[0]]
    kept = (renumber[families[0][old]],) + tuple(f[old] for f in families[1:])
    found = (found[0] + int(keep.sum()),) + found[1:]
    return (np.concatenate([starts[keep], new_starts]), np.concatenate([ends[keep], new_ends]),
            tuple(np.concatenate(x) for x in zip(kept, found)), np.concatenate([bad_piece[keep], new_bad]))


def _parts_by_interpolation(enumerated, starts, ends, new_starts, new_ends, whole, budget: int):
    """What :func:`_families` finds on the parts ``[new_starts, new_ends]`` of the pieces ``whole`` (families,
    parts that break a condition), from the pieces' enumerations, or None where that is not certain.

    A part of a piece whose guards and chunk ranges agree at its ends (not unsure) has the guards' truth and
    the chunk tuples of the piece (affine guards, monotone chunk bounds: module docstring), so its families are
    the piece's, in the same order; their level-0 bounds are affine on the piece, so their values at the
    part's ends lie on the line through the piece's ends. None where a piece cut is unsure, where a bound's
    change over a piece is not a multiple of its length (not affine: the parts are enumerated instead), or
    where enumerating the parts could pass the ``budget`` (a part has at most its piece's chunks per level)."""
    times = int(np.bincount(whole).max())                          # the most parts of one piece
    cut = np.bincount(whole, minlength=len(starts)) > 1
    if times * sum(e.peak + len(o) for o, *_, e in enumerated) > budget:
        return None
    parts, bad = [], np.zeros(len(new_starts), bool)
    span = np.maximum(ends - starts, 1)
    for owner, _, _, unsure, _, _, bounds in enumerated:
        if any_true(unsure & cut):
            return None
        bad |= unsure[whole]                                       # a piece not cut: as it was
        first = owner.searchsorted(whole)                          # owners ascend: each part's piece's families
        count = owner.searchsorted(whole, side="right") - first
        part = np.repeat(np.arange(len(new_starts)), count)
        family = np.repeat(first - (count.cumsum() - count), count) + np.arange(int(count.sum()))
        if not len(family):
            continue
        lows_a, highs_a, lows_b, highs_b = bounds.of(family)
        a, b = np.array(lows_a + highs_a), np.array(lows_b + highs_b)       # [bounds, families]
        length = span[whole][part]
        slope = (b - a) // length
        if any_true(slope * length != b - a):
            return None
        n = len(lows_a)
        (lo0, hi0, below0), (lo1, hi1, below1) = (_interval(a + slope * (rows - starts[whole])[part], n)
                                                  for rows in (new_starts, new_ends))
        live = (lo0 < hi0) & (lo1 < hi1)
        dead = (lo0 >= hi0) & (lo1 >= hi1) & (below0 & below1).reshape(-1, len(family)).any(axis=0)
        bad[part[~live & ~dead]] = True
        parts.append((part[live], lo0[live], hi0[live], lo1[live], hi1[live]))
    empty = np.zeros(0, np.int64)
    return tuple(np.concatenate(x) for x in zip(*parts)) if parts else (empty,) * 5, bad


def _interval(values: np.ndarray, lows: int):
    """From every bound's values [bounds, families], the lower ones first (``lows`` of them): the intervals
    ``[lo, hi)`` and, per (upper, lower) pair, whether the upper bound lies below the lower one."""
    low, high = values[:lows], values[lows:]
    return low.max(axis=0), high.min(axis=0) + 1, high[:, None] < low[None]


def _hull_order(families, kv_len: int, sort: bool = True):
    """``(families, h0, h1, same)``: the families sorted by piece and hull start (a stable sort; None where
    they are out of that order and ``sort`` is off), their hulls ``[h0, h1)``, and whether each follows one
    of its piece."""
    found = _keyed_hull_order(families, kv_len, sort)
    return None if found is None else found[0]


def _keyed_hull_order(families, kv_len: int, sort: bool = True):
    """``(ordered, key)``: :func:`_hull_order`'s answer (None where it is None) and the order's key, ``piece *
    (kv_len + 1) + h0`` of each family (ascending), for a search among them (:func:`_apart`)."""
    piece, la, ha, lb, hb = families
    h0 = np.minimum(la, lb)
    key = piece * (kv_len + 1) + h0
    if any_true(key[1:] < key[:-1]):
        if not sort:
            return None
        order = key.argsort(kind="stable")
        piece, la, ha, lb, hb, h0, key = piece[order], la[order], ha[order], lb[order], hb[order], h0[order], key[order]
    return ((piece, la, ha, lb, hb), h0, np.maximum(ha, hb), piece[1:] == piece[:-1]), key


def _nothing_covered(families, h0, h1, same) -> bool:
    """Whether :func:`_drop_covered` keeps the families (in :func:`_hull_order`) as they are: where none is
    constant over its piece, or where each piece's hulls are disjoint (each starts at or after the previous
    one's end) and no two constant ones touch (they would merge; none can hold another)."""
    _, la, ha, lb, hb = families
    constant = (la == lb) & (ha == hb)
    if not any_true(constant):
        return True
    gap = h0[1:] - h1[:-1]
    return not any_true(same & ((gap < 0) | ((gap == 0) & constant[1:] & constant[:-1])))


def _drop_covered(piece, la, ha, lb, hb, kv_len: int):
    """Families constant over their piece replaced by their union; other families inside it dropped. Where the
    union merges none and none lies inside it, the families come back as they are (in their order)."""
    constant = (la == lb) & (ha == hb)
    if not any_true(constant):
        return piece, la, ha, lb, hb
    c_piece, c_lo, c_hi = union(piece[constant], la[constant], ha[constant], kv_len)
    h0 = np.minimum(la, lb)
    at = _union_holding(piece, h0, c_piece, c_lo, kv_len)
    safe = np.maximum(at, 0)
    inside = (~constant & (at >= 0) & (c_piece[safe] == piece) & (c_lo[safe] <= h0)
              & (c_hi[safe] >= np.maximum(ha, hb)))
    if not any_true(inside) and len(c_piece) == np.count_nonzero(constant):
        return piece, la, ha, lb, hb
    keep = ~constant & ~inside
    piece, la, ha, lb, hb = piece[keep], la[keep], ha[keep], lb[keep], hb[keep]
    return (np.concatenate([c_piece, piece]), np.concatenate([c_lo, la]), np.concatenate([c_hi, ha]),
            np.concatenate([c_lo, lb]), np.concatenate([c_hi, hb]))


def _union_holding(piece: np.ndarray, h0: np.ndarray, c_piece: np.ndarray, c_lo: np.ndarray, kv_len: int):
    """Per family (of ``piece``, hull from ``h0``), the index of the only interval of the constant families'
    union (``c_piece``, ``c_lo``: sorted by piece and start, disjoint) that can hold it, -1 or an interval of
    another piece where none can; the caller checks that it does (its piece, its start at or before ``h0``, its
    end). Among several of a piece that is the last one starting at or before ``h0`` (a search); with one union
    interval per piece (usual: a text region's keys) it is that one, looked up in a table by piece: a gather,
    cheaper than the search (clear's 7.7K unsorted families: `_drop_covered` 163 -> 127 us)."""
    if len(c_piece) and all_true(c_piece[1:] != c_piece[:-1]):
        slot = np.full(int(max(piece.max(), c_piece.max())) + 1, -1)
        slot[c_piece] = np.arange(len(c_piece))
        return slot[piece]
    width = kv_len + 1
    return (c_piece * width + c_lo).searchsorted(piece * width + h0, side="right") - 1
