"""maskc.runs.floor_blocks / ceil_blocks (a shift for powers of two) against Python's floor division."""
import numpy as np
from hypothesis import given, strategies as st

from maskc.runs import ceil_blocks, floor_blocks

_VALUES = st.lists(st.one_of(st.integers(-1000, 1000), st.integers(-(2 ** 62), 2 ** 62)), min_size=1, max_size=30)


@given(_VALUES, st.one_of(st.integers(0, 12).map(lambda n: 2 ** n), st.integers(1, 300)))
def test_blocks_of_positions_are_floor_and_ceil_division(values, block):
    x = np.array(values, np.int64)
    assert floor_blocks(x, block).tolist() == [v // block for v in values]
    assert ceil_blocks(x, block).tolist() == [-(-v // block) for v in values]
    assert floor_blocks(np.int64(values[0]), np.int64(block)) == values[0] // block
