"""maskc.analysis.periodic: a region's families on a run of translated pieces written once (clear's image rows), the
proof that the run's pieces are translates (step_moves through a FamilyProgram's steps), and piece_runs' column path
on the run: against brute force, against the families enumerated in full, and refused where the translates fail."""
import numpy as np
from hypothesis import event, example, given, settings, strategies as st

import maskc
import maskc.analysis.periodic as periodic
import maskc.analysis.piece_tiles as piece_tiles
from maskc.analysis.descriptor import unpack
from conftest import tile_truth


@st.composite
def _programs(draw):
    """A random FamilyProgram's shapes over two gathered owners' values and one chunk index, and each step as a
    Python function of (owner o, family j)."""
    owner_a, owner_b = draw(st.integers(-5, 5)), draw(st.integers(-5, 5))      # each owner value: a + s * o
    slope_a, slope_b = draw(st.integers(-3, 3)), draw(st.integers(-3, 3))
    owners = {10: (owner_a, slope_a), 11: (owner_b, slope_b)}
    c = draw(st.integers(-3, 3))                                                # the chunk index moves c an owner
    shapes, fns = [], []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["chunk", "owner", "sum", "other"] if shapes else ["chunk", "owner"]))
        if kind == "chunk":
            shapes.append(("chunk", "J"))
            fns.append(lambda o, j: j + c * o)
        elif kind == "owner":
            i = draw(st.sampled_from(sorted(owners)))
            a, s = owners[i]
            shapes.append(("owner", i))
            fns.append(lambda o, j, a=a, s=s: a + s * o)
        elif kind == "sum":
            at = draw(st.sampled_from([None, *sorted(owners)]))
            parts = tuple((draw(st.integers(0, len(shapes) - 1)), draw(st.integers(-3, 3)))
                          for _ in range(draw(st.integers(1, 3))))
            a, s = owners[at] if at is not None else (0, 0)
            shapes.append(("sum", at, parts))
            fns.append(lambda o, j, a=a, s=s, parts=parts, prev=list(fns): a + s * o + sum(k * prev[i](o, j)
                                                                                          for i, k in parts))
        else:
            i = draw(st.integers(0, len(shapes) - 1))                   # a square: not additive in its input
            shapes.append(("other", (i,)))
            fns.append(lambda o, j, i=i, prev=list(fns): prev[i](o, j) ** 2)
    return shapes, fns, {i: s for i, (_, s) in owners.items()}, c


@settings(max_examples=300)
@given(_programs(), st.integers(-4, 4))
def test_step_moves_are_the_values_moves(program, j):
    """Every move step_moves proves is the step's change from owner o to o + 1 at the family moved with it, at
    every owner; a square of a moving value is never proved (a square's change grows with the owner)."""
    shapes, fns, owner_move, c = program
    moves = periodic.step_moves(shapes, owner_move, {"J": c})
    for shape, fn, move in zip(shapes, fns, moves):
        event(f"{shape[0]}: {'proved' if move is not None else 'refused'}")
        if move is not None:
            assert [fn(o, j) - fn(0, j) for o in range(5)] == [o * move for o in range(5)]
        if shape[0] == "other":
            inner = moves[shape[1][0]]
            assert (move is None) == (inner != 0)


_KINDS = {
    "disc": "(y(q) - y(k)) ** 2 + (x(q) - x(k)) ** 2 < c ** 2",                 # clear's: runs of translates
    "growing disc": "(y(q) - y(k)) ** 2 + (x(q) - x(k)) ** 2 < c ** 2 + y(q)",  # the root reads y(q): refused
    "disc by row parity": "(y(q) - y(k)) ** 2 + (x(q) - x(k)) ** 2 < (c + y(q) % 2) ** 2",   # not affine: refused
    "wide by column": "(y(q) - y(k)) ** 2 + (x(q) - x(k)) ** 2 < c ** 2 + x(q)",   # moves by 0 a row: translates
    "half speed": "(y(q) - 2 * y(k)) ** 2 + (x(q) - x(k)) ** 2 < c ** 2",
}


def _bound(kind, columns, seq_len, kv_len, t, w, c):
    text = f"""
mask m(t: int, w: int, c: int)
  let y(i) = (i - t) // w
  let x(i) = (i - t) % w
  allow {" or ".join(sorted(columns) + [_KINDS[kind]])}
"""
    return maskc.compile_mask(text).bind(seq_len=seq_len, kv_len=kv_len, t=t, w=w, c=c)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["disc"] * 4 + sorted(_KINDS)), st.sets(st.sampled_from(["k < t", "q < t"]), min_size=1),
       st.sampled_from([2, 4, 8]), st.integers(0, 3), st.sampled_from([1, 1, 2, 3]), st.integers(8, 40),
       st.one_of(st.just(0), st.integers(-40, 8)), st.sampled_from([1, 2, 4]), st.integers(1, 4))
@example("disc", {"k < t", "q < t"}, 4, 2, 1, 30, 0, 4, 3)           # clear's shape: a long run, block_n = w
@example("disc", {"k < t"}, 4, 1, 2, 24, -13, 2, 2)                   # kv_len cuts an image row: the clip binds
@example("growing disc", {"k < t", "q < t"}, 4, 1, 1, 30, 0, 4, 3)
def test_runs_of_translated_pieces_give_the_classes_and_descriptor(kind, columns, block_m, t_blocks, w_blocks,
                                                                  rows, kv_change, block_n, c):
    """Masks of clear's kind (a column beside a disc-like rule over image rows that are whole q_blocks, so a
    piece a q_block) and kinds whose pieces are not translates (a radius read at q, one by row parity): tile
    classes against brute force, and the descriptor bit for bit against the one with the runs expanded at once
    (periodic.families off), at kv_len equal to seq_len or clipping the image. (Image rows of several q_blocks
    repeat every few pieces, not every piece: no run is looked for there, a choice of path.)"""
    t, w = t_blocks * block_m, w_blocks * block_m
    seq_len = t + rows * w
    kv_len = max(1, seq_len + kv_change)
    bound = _bound(kind, columns, seq_len, kv_len, t, w, c)
    taken = []
    real_families, real_inner = periodic.families, piece_tiles._inner_copies

    def spy(*args):
        found = real_families(*args)
        taken.append(found is not None)
        return found

    def copies_spy(rows, run, block_n):
        taken.append("copied")
        return real_inner(rows, run, block_n)
    periodic.families, piece_tiles._inner_copies = spy, copies_spy
    try:
        tile_map = bound.tile_map(block_m, block_n)
        descriptor = bound.descriptor(block_m, block_n)
    finally:
        periodic.families, piece_tiles._inner_copies = real_families, real_inner
    event(f"{kind}: run {'found' if True in taken else 'not found'}, {'copied' if 'copied' in taken else 'expanded'}")
    if kind in ("growing disc", "disc by row parity"):
        assert True not in taken, "a run proved where the pieces are not translates"
    truth = tile_truth(bound.dense(), block_m, block_n)
    np.testing.assert_array_equal(tile_map.classes[0], truth)
    periodic.families = lambda *args: None
    try:
        plain = _bound(kind, columns, seq_len, kv_len, t, w, c).descriptor(block_m, block_n)
    finally:
        periodic.families = real_families
    for got, want in zip(unpack(descriptor), unpack(plain)):
        np.testing.assert_array_equal(got, want)
