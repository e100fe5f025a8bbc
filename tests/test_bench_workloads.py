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


@pytest.mark.parametrize("name", W.SCORE_MASKS)
def test_hand_written_score_mod_is_the_example(name):
    """The Flex score_mod the benchmark times is maskc's modifier: against the numpy reference's (through the
    bound mask's own score_mod export, which tests/test_score.py checks against an independent numpy one),
    on random scaled scores, every head the benchmark runs."""
    S = 300
    w = W.workload(name, S, device="cpu")
    assert [p.name for p in w.bound().mask.resolved.params] == list(w.params.keys() - {"num_heads"})
    ours = w.bound().flex_score_mod()
    q, k = torch.arange(S)[:, None], torch.arange(S)[None, :]
    scores = torch.randn(S, S, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 20
    for h in range(16):
        b, head = torch.tensor(0), torch.tensor(h)
        theirs = w.score_mod()(scores, b, head, q, k)
        torch.testing.assert_close(theirs, ours(scores, b, head, q, k), rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_hand_written_hstu_mask_mod_follows_jagged_lengths(seed):
    """bench/bench_train_step.py's per-step batches: random user lengths and target counts written into the
    tables the hand-written hstu mask_mod reads give the example bound to those values (Flex and maskc train on
    the same mask every step)."""
    rng = np.random.default_rng(seed)
    S = 1500
    users, targets = W.jagged_users(S, int(rng.integers(1, 9)), rng)
    assert sum(users) == S and all(0 <= t <= u for t, u in zip(targets, users))
    params = {"users": users, "targets": targets, "context": 0}
    w = W.Workload("hstu", S, "hstu", params, W.hstu_tables(users, targets, 0, device="cpu"))
    q, k = torch.arange(S)[:, None], torch.arange(S)[None, :]
    zero = torch.zeros((), dtype=torch.int64)
    theirs = w.mask_mod()(zero, zero, q, k).numpy()
    ours = w.bound().dense(0)
    mismatch = np.argwhere(theirs != ours)
    assert not len(mismatch), f"{users} {targets}: {len(mismatch)} cells differ, first (q, k) = {tuple(mismatch[0])}"
