"""The benchmark's hand-written mask_mods (bench/workloads.py) are the masks maskc binds: a peer timed on a
different mask would make every ratio meaningless. Checked cell for cell on the CPU, at lengths where the
example's parameters still leave several rows, frames and documents."""
import sys

import numpy as np
import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "bench"))
import workloads as W  # noqa: E402


@pytest.mark.parametrize("name", W.ALL_MASKS)
@pytest.mark.parametrize("S", [1000, 2048])
def test_hand_written_mask_mod_is_the_example(name, S):
    w = W.workload(name, S, device="cpu")
    q = torch.arange(S)[:, None]
    k = torch.arange(S)[None, :]
    zero = torch.zeros((), dtype=torch.int64)
    theirs = w.mask_mod()(zero, zero, q, k).numpy()
    ours = w.bound().dense(0)
    assert theirs.shape == ours.shape and ours.any()
    mismatch = np.argwhere(theirs != ours)
    assert not len(mismatch), f"{name}: {len(mismatch)} cells differ, first (q, k) = {tuple(mismatch[0])}"
