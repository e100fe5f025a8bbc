"""maskc.runs' launch model of the dK/dV grid: which column slot each work item takes (launch_slots, against a
transcription of the kernel's head_and_slot one item at a time) and whether a persistent grid pays
(persistent_pays, against a simulation of both launches and on real descriptors)."""
import heapq

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import maskc
from maskc.runs import (ITEM_START_STEPS, PERSISTENT_ITEM_STEPS, launch_slots, persistent_pays, row_costs)

from conftest import EXAMPLES


def head_and_slot(cta: int, grid_x: int, heads: int, section_heads: int, front: int) -> tuple[int, int]:
    """templates/attention_bwd.cu.j2's head_and_slot, line for line."""
    if cta < front * heads:
        return cta % heads, cta // heads
    blocks, rest = grid_x // heads - front, cta - front * heads
    section = rest // (blocks * section_heads)
    first = section * section_heads
    here = min(section_heads, heads - first)
    j = rest - section * blocks * section_heads
    return first + j % here, front + j // here


@given(slots=st.integers(1, 40), heads=st.integers(1, 9), section_heads=st.integers(1, 9), data=st.data())
def test_launch_slots_follow_the_kernels_mapping(slots, heads, section_heads, data):
    section_heads = min(section_heads, heads)
    front = data.draw(st.integers(0, slots))
    grid_x = slots * heads
    got = launch_slots(slots, heads, section_heads, front)
    want = [head_and_slot(x, grid_x, heads, section_heads, front) for x in range(grid_x)]
    assert got.tolist() == [slot for _, slot in want]
    # every (head, slot) once: the launch covers the work exactly
    assert sorted(want) == [(h, s) for h in range(heads) for s in range(slots)]


def simulated_launches(costs: np.ndarray, sms: int) -> tuple[float, float]:
    """(persistent, one CTA an item) end times by brute force: static shares item by item, and the hardware's
    dispatch as a list schedule (each item to the SM free first, in launch order)."""
    shares = [0.0] * sms
    for i, c in enumerate(costs):
        shares[i % sms] += c + PERSISTENT_ITEM_STEPS
    free = [0.0] * sms
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c + ITEM_START_STEPS)
    return max(shares), max(free)


@given(costs=st.lists(st.floats(0, 300, allow_nan=False), min_size=1, max_size=400), sms=st.integers(1, 64))
def test_persistent_pays_only_where_it_beats_the_dispatch(costs, sms):
    """Where the model says it pays, the persistent grid's static shares end before even a perfect balance of one
    CTA an item, and so before the hardware's list schedule (never worse than perfect balance)."""
    costs = np.array(costs)
    persistent, per_item = simulated_launches(costs, sms)
    if persistent_pays(costs, sms):
        assert len(costs) > sms and persistent < per_item + 1e-9
    elif len(costs) > sms:
        assert persistent >= (costs.sum() + len(costs) * ITEM_START_STEPS) / sms - 1e-9


@pytest.mark.parametrize("cost", [1.0, 18.0, 500.0])
def test_alike_items_over_many_waves_pay(cost):
    assert persistent_pays(np.full(132 * 31, cost), 132)
    assert not persistent_pays(np.full(132, cost), 132)          # one wave: nothing between items to save


def _item_costs(name, seq_len, heads, **params):
    desc = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=seq_len, **params).descriptor(64, 128)
    slot_costs = row_costs(desc.col_offsets, desc.col_runs)[desc.col_work_order]
    return slot_costs[launch_slots(len(slot_costs), heads, 4, 0)]


def test_sliding_window_pays_and_causal_does_not():
    """The benchmark's shapes (32K, 16 heads, 132 SMs): sliding_window's short columns pay, causal's long
    heaviest-first columns (a static share loses more to imbalance than the CTA starts cost) do not."""
    assert persistent_pays(_item_costs("sliding_window", 32768, 16), 132)
    assert not persistent_pays(_item_costs("causal", 32768, 16), 132)
