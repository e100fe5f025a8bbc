"""maskc/analysis/formprog.py: a mask's forms compiled to numpy steps give RowValues' values."""
import math

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import maskc
from maskc import ir
from maskc.analysis.formprog import Env, OwnerRuns, gathered_at, program_of
from maskc.analysis.rows import RowValues, isqrt, k_bound_rows

from mask_strategies import binding, mask_text


def _bound_and_specialized(text, bind_args):
    """The mask of ``text`` bound to ``bind_args`` and specialized to its int parameters, else None (a draw that
    does not compile or bind)."""
    try:
        compiled = maskc.compile_mask(text)
        seq_len, kv_len, params = bind_args
        bound = compiled.bind(seq_len, kv_len, **params)
    except maskc.MaskError:
        return None
    return bound, compiled.specialized(bound.params.batch[0].ints)


@settings(max_examples=150, deadline=None)
@given(text=mask_text(exact=False), bind_args=binding(max_len=60), rows=st.lists(st.integers(-3, 70), min_size=1))
def test_programs_give_the_values_of_row_values(text, bind_args, rows):
    """Every bound and guard of every region of random masks (q-side expressions with segments, per-segment
    values, min/max, floors, squares, bit operations), at random positions (some outside [0, seq_len))."""
    found = _bound_and_specialized(text, bind_args)
    if found is None:
        return
    bound, special = found
    seq_len, kv_len = bound.seq_len, bound.kv_len
    items = [(b, lower) for r in special.allow + special.deny for lower, bs in ((True, r.lower), (False, r.upper))
             for b in bs] + [(g.lin, None) for r in special.allow + special.deny for g in r.guards + r.static_guards]
    program = program_of(items)
    event(f"compiled: {program is not None}")
    if program is None:             # a form reads k or a chunk index
        return
    q = np.array(rows, np.int64)
    element = bound.params.batch[0]
    got = program.run(Env(element, seq_len, kv_len, 0, 0, q))
    reference = RowValues(element, seq_len, kv_len, 0, 0, q)
    for (item, lower), value in zip(items, got):
        want = reference.lin(item) if lower is None else k_bound_rows(item, reference, lower=lower)
        np.testing.assert_array_equal(np.broadcast_to(value, q.shape), np.broadcast_to(want, q.shape))


@settings(max_examples=150, deadline=None)
@given(text=mask_text(exact=False), bind_args=binding(max_len=60), rows=st.lists(st.integers(-3, 70), min_size=1),
       shifts=st.lists(st.integers(-5, 5), min_size=1, max_size=4))
def test_forms_a_constant_apart_give_the_values_of_row_values(text, bind_args, rows, shifts):
    """Every form of several terms of random masks and copies of it shifted by constants (FormProgram computes a
    later one as the first one's step plus the difference): each RowValues' value."""
    found = _bound_and_specialized(text, bind_args)
    if found is None:
        return
    bound, special = found
    seq_len, kv_len = bound.seq_len, bound.kv_len
    lins = [x.lin for r in special.allow + special.deny for x in r.lower + r.upper + r.guards + r.static_guards]
    lins = [ir.Lin(lin.terms, lin.const + shift) for lin in lins if len(lin.terms) > 1 for shift in [0] + shifts]
    program = program_of([(lin, None) for lin in lins])
    event(f"forms of several terms: {len(lins) > 0}, compiled: {program is not None}")
    if program is None or not lins:
        return
    q = np.array(rows, np.int64)
    element = bound.params.batch[0]
    got = program.run(Env(element, seq_len, kv_len, 0, 0, q))
    reference = RowValues(element, seq_len, kv_len, 0, 0, q)
    for lin, value in zip(lins, got):
        np.testing.assert_array_equal(np.broadcast_to(value, q.shape), np.broadcast_to(reference.lin(lin), q.shape))


@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(1, 3), st.booleans(), st.data())
def test_owner_runs_gather_as_the_index_does(counts, points, same, data):
    """gathered_at through OwnerRuns (np.repeat over families in owner order) equals the gather through the
    index [points, families] it stands for, values equal at every point or not; both give one row exactly
    where the values are equal at every point (a value then computed once for all points)."""
    n = len(counts)
    first = np.array(data.draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n)), np.int64)
    x = np.concatenate([first] * points) if same else np.array(
        data.draw(st.lists(st.integers(-50, 50), min_size=n * points, max_size=n * points)), np.int64)
    owner = np.repeat(np.arange(n), counts)
    index = owner[None] + n * np.arange(points)[:, None]
    runs = OwnerRuns(points, np.array(counts, np.intp), sum(counts))
    assert runs.shape == index.shape
    np.testing.assert_array_equal(gathered_at(x, runs), gathered_at(x, index))
    got = gathered_at(x, index)
    np.testing.assert_array_equal(np.broadcast_to(got, index.shape), x[index])
    equal = (x.reshape(points, n) == x[:n]).all()
    assert got.shape[0] == (1 if equal else points)
    assert gathered_at(np.int64(7), runs) == 7


@given(st.integers(-2**62, 2**62), st.one_of(st.integers(0, 300), st.just(2**40)), st.integers(1, 400), st.sampled_from([(1, -1), (-1,), (2, -1)]),
       st.randoms(use_true_random=False))
def test_isqrt_is_the_floor_of_the_root_over_narrow_and_wide_ranges(base, spread, count, shape, rnd):
    """rows.isqrt against math.isqrt (0 below 0): arrays of 1 to 400 values (the table of a narrow range taken past
    64 values spanning less than a quarter of their count) within ``spread`` of ``base``, anywhere in int64's
    range (negative ones too), 1-D and 2-D; the value at each position, not only the set of values. A spread of
    2**40 keys must not take a table (it could not be allocated)."""
    values = np.array([base + rnd.randint(0, spread) for _ in range(count)], np.int64)
    values = values.reshape(shape if len(shape) == 1 or count % shape[0] == 0 else (-1,))
    event(f"narrow: {values.size > 64 and int(values.max()) - int(values.min()) < values.size // 4}")
    want = np.array([math.isqrt(max(int(v), 0)) for v in values.ravel()], np.int64).reshape(values.shape)
    got = isqrt(values)
    assert got.shape == values.shape
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=6), origin=st.integers(0, 4),
       extra=st.integers(0, 5), positions=st.lists(st.integers(-3, 45), min_size=1, max_size=20))
def test_segment_attributes_are_the_segments_by_hand(lengths, origin, extra, positions):
    """segment_attr's tables (each built alone, per attribute) give every attribute of the segment holding each
    position, worked out by a walk over the segments: outside the range, index -1 and inside false, start and end
    those of the gap before the first segment ([0, origin)) or after the last ([end, extent)), safe clipped."""
    from maskc.bound_params import SegmentTable
    from maskc.analysis.rows import segment_attr, segment_slot
    bounds = np.concatenate([[origin], origin + np.cumsum(lengths)]).astype(np.int64)
    values = np.arange(10, 10 + len(lengths), dtype=np.int64) * 7
    table = SegmentTable(bounds, (("v", values),))
    extent = int(bounds[-1]) + extra
    q = np.array(positions, np.int64)
    at = segment_slot(table, q)
    n = len(lengths)
    for p, got in zip(positions, zip(*(segment_attr(table, at, a, extent).tolist()
                                         for a in ("index", "start", "end", "length", "inside", "safe")),
                                     segment_attr(table, at, "value", extent, "v").tolist())):
        i = next((i for i in range(n) if bounds[i] <= p < bounds[i + 1]), None)
        if i is None:
            before = p < origin
            start, end = (0, origin) if before else (int(bounds[-1]), extent)
            want = (-1, start, end, end - start, False, 0 if before else max(n - 1, 0), 0)
        else:
            want = (i, int(bounds[i]), int(bounds[i + 1]), lengths[i], True, i, int(values[i]))
        assert got == want, (p, got, want)


@given(st.integers(-300, (1 << 16) + 300), st.integers(0, 1 << 12), st.integers(1, 300),
       st.randoms(use_true_random=False))
def test_isqrt_takes_the_kept_roots_below_their_end(base, spread, count, rnd):
    """rows.isqrt against math.isqrt where the values lie about the kept roots' end (rows.KEPT_ROOTS: below it the
    table is read, at or past it the other paths), negative values included: each position's value."""
    from maskc.analysis.rows import KEPT_ROOTS

    values = np.array([base + rnd.randint(0, spread) for _ in range(count)], np.int64)
    event(f"kept: {count > 64 and int(values.max()) < KEPT_ROOTS}")
    want = np.array([math.isqrt(max(int(v), 0)) for v in values], np.int64)
    np.testing.assert_array_equal(isqrt(values), want)


@pytest.mark.parametrize("last", [(1 << 16) - 1, 1 << 16, (1 << 16) + 1])
def test_isqrt_at_the_kept_roots_end(last):
    """The greatest value just below, at and past the kept roots' end (the table's last entry, then none)."""
    values = np.arange(last - 80, last + 1, dtype=np.int64)[::-1]
    np.testing.assert_array_equal(isqrt(values), [math.isqrt(int(v)) for v in values])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-40, 300), min_size=1, max_size=6), st.lists(st.integers(0, 5), min_size=1, max_size=6),
       st.integers(-3, 3), st.integers(-3, 3), st.integers(-3, 3), st.integers(-2, 2), st.integers(-50, 300),
       st.integers(-5, 5))
def test_family_lins_with_and_without_a_chunk_free_part(rows, counts, c_j, c_root, c_q, c_sq, radius2, const):
    """FamilyProgram's lins (chunk-reading parts, and a chunk-free part of q and a constant that may be 0, as clear's
    ``128 J1 +- root``) against each family worked out in Python ints: ``c_q q + const + c_j J + c_root isqrt(radius2 -
    (q - J)**2) + c_sq (q - J)**2``, the families (owner, J) with J counting up from each owner's row."""
    from maskc import ir
    from maskc.analysis import linear as L
    from maskc.analysis.formprog import FamilyProgram, FormProgram

    n = min(len(rows), len(counts))
    q, counts = np.array(rows[:n], np.int64), np.array(counts[:n], np.intp)
    owner = np.repeat(np.arange(n), counts)
    j_var, q_term = ir.ChunkVar(0), L.of_term(ir.Pos("q"))
    J = L.of_term(j_var)
    distance = L.sub(q_term, J)
    square = L.of_term(ir.Square(distance))
    root = L.of_term(ir.Root(L.sub(L.const(radius2), square)))
    fixed = L.add(L.scale(q_term, c_q), L.const(const))
    lin = L.add(L.add(L.add(fixed, L.scale(J, c_j)), L.scale(root, c_root)), L.scale(square, c_sq))
    program = FamilyProgram(FormProgram())
    at = program.lin(lin)
    j = (q[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)) if len(owner) else owner
    env = Env(None, 1000, 1000, 0, 0, None, {j_var: j})
    owner_values = program.owners.values(Env(None, 1000, 1000, 0, 0, q))
    got = program.values(env, owner_values, owner[None])[at]
    want = [c_q * int(q[o]) + const + c_j * int(jj) + c_root * math.isqrt(max(radius2 - (int(q[o]) - int(jj)) ** 2, 0))
            + c_sq * (int(q[o]) - int(jj)) ** 2 for o, jj in zip(owner, j)]
    event(f"chunk-free part zero: {fixed == L.ZERO}")
    np.testing.assert_array_equal(np.broadcast_to(got, (1, len(owner))).ravel(), np.array(want, np.int64))


@given(st.lists(st.integers(-2**63, -1), min_size=1, max_size=40), st.lists(st.integers(0, (1 << 16) - 1), min_size=65,
                                                                          max_size=120), st.randoms(use_true_random=False))
def test_isqrt_reads_root_0_for_negatives_of_any_size_among_kept_ones(negatives, kept, rnd):
    """Below the kept roots' end, negative values (down to int64's least) read root 0 wherever they stand among
    the others (the table is taken with its index clipped, not wrapped or checked)."""
    values = kept + negatives
    rnd.shuffle(values)
    values = np.array(values, np.int64)
    np.testing.assert_array_equal(isqrt(values), [math.isqrt(max(int(v), 0)) for v in values])
