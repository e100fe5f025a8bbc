"""The forward's walk over a row block's kv tiles (templates/tile_walk.cu.j2) under g++, against the descriptor
itself: each row block's tiles visited once, in order, each with its run's kind, and every PARTIAL tile's slot()
the number maskc.runs.partial_slots gives that (row block, key block) (the stored path's words are found by it)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import maskc
from maskc.codegen.emit import _environment, template_dir
from maskc.runs import PARTIAL, partial_slots
from conftest import EXAMPLES, example_params
from host_cxx import build_library

HOST_PRELUDE = """#define __device__
#define __forceinline__ inline
namespace maskc {
"""
HOST_WALK = """
}  // namespace maskc
// Every tile of one row block's runs [run_first, run_end), in the walk's order: its key block, kind and slot().
extern "C" int walk_row(const int* runs, const int* slots, int run_first, int run_end, int* blocks, int* kinds,
                        int* tile_slots) {
    int n = 0;
    for (maskc::TileWalk walk(runs, run_first, run_end, slots); walk.valid(); walk.next(), ++n) {
        blocks[n] = walk.kv_block;
        kinds[n] = walk.kind;
        tile_slots[n] = walk.slot();
    }
    return n;
}
"""


@pytest.fixture(scope="module")
def walk_row():
    """The template's TileWalk compiled by g++: walk_row(runs, slots, run_first, run_end) -> (blocks, kinds, slots)."""
    body = _environment(str(template_dir())).get_template("tile_walk.cu.j2").render()
    lib = build_library(HOST_PRELUDE + body + HOST_WALK, "the walk", ("-O2", "-Wall"))
    pointer = ctypes.c_void_p

    def run(runs: np.ndarray, slots: np.ndarray, run_first: int, run_end: int):
        cap = int((runs[run_first:run_end, 1] - runs[run_first:run_end, 0]).sum()) + 1
        out = [np.full(cap, -7, np.int32) for _ in range(3)]
        n = lib.walk_row(runs.ctypes.data_as(pointer), slots.ctypes.data_as(pointer), run_first, run_end,
                         *(o.ctypes.data_as(pointer) for o in out))
        return [o[:n] for o in out]
    return run


def _check_descriptor(walk_row, desc) -> int:
    """Walk every row block of ``desc``'s row view; the number of tiles walked."""
    runs = np.ascontiguousarray(desc.runs, np.int32)
    run_slots, tiles = partial_slots(desc.run_offsets, desc.runs)
    run_slots = np.ascontiguousarray(run_slots, np.int32)
    slot_of = {(int(r), int(kb)): n for n, (r, kb) in enumerate(tiles)}
    walked = 0
    for r in range(len(desc.run_offsets) - 1):
        first, end = int(desc.run_offsets[r]), int(desc.run_offsets[r + 1])
        expected = [(kb, int(kind)) for begin, stop, kind in desc.runs[first:end] for kb in range(begin, stop)]
        blocks, kinds, slots = walk_row(runs, run_slots, first, end)
        assert list(zip(blocks.tolist(), kinds.tolist())) == expected, f"row block {r}"
        for kb, kind, slot in zip(blocks.tolist(), kinds.tolist(), slots.tolist()):
            if kind == PARTIAL:
                assert slot_of[(r, kb)] == slot, f"row block {r}, key block {kb}: slot {slot}"
        walked += len(expected)
    return walked


@pytest.mark.parametrize("name", ["document", "global_local", "hstu", "clear", "neighborhood", "sliding_window"])
def test_walk_visits_every_tile_of_the_examples_descriptors(walk_row, name):
    rng = np.random.default_rng(7)
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=3000, **example_params(name, 3000, rng, 4))
    assert _check_descriptor(walk_row, bound.descriptor(128, 128)) > 0


@settings(max_examples=40, deadline=None)
@given(docs=st.lists(st.integers(1, 700), min_size=1, max_size=6), globals_=st.integers(0, 300),
       block=st.sampled_from([(64, 64), (128, 128), (192, 128)]))
def test_walk_visits_every_tile_of_rows_of_several_runs(walk_row, docs, globals_, block):
    """Documents with global keys: row blocks of one to several runs (the globals, gaps, FULL and PARTIAL runs)."""
    text = ("mask m(docs: segments, globals: int)\n  allow same(docs), k <= q\n  allow k < globals\n")
    bound = maskc.compile_mask(text).bind(seq_len=sum(docs), docs=docs, globals=globals_)
    _check_descriptor(walk_row, bound.descriptor(*block))
