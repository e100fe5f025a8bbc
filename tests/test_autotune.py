"""The autotuner's decision and memory (maskc.runtime.autotune), with fake runs and timings: no GPU."""
from __future__ import annotations

import pytest

import maskc
from maskc.runtime.cache import DiskCache
from maskc.runtime.autotune import TuningCache, describe, parse, pick, tuning_key
from maskc.codegen.schedule import Tiles, forward_candidates
from conftest import EXAMPLES

MMA, TMA, TMA64, WG = (Tiles(128, 64, 4, "mma"), Tiles(128, 128, 8, "wgmma_tma"), Tiles(128, 64, 8, "wgmma_tma"),
                       Tiles(192, 128, 12, "wgmma_tma"))


def fake(outputs, times):
    """run / agrees / measure over tables: outputs[c] is c's result (an Exception is raised)."""
    runs = []

    def run(c):
        runs.append(c)
        out = outputs[c]
        if isinstance(out, Exception):
            raise out
        return out

    return run, (lambda a, b: abs(a - b) <= 0.01), (lambda c: times[c]), runs


def test_picks_the_fastest_that_agrees():
    run, agrees, measure, _ = fake({MMA: 1.0, TMA: 1.0, TMA64: 1.005, WG: 1.0},
                                   {MMA: 10.0, TMA: 7.0, TMA64: 6.5, WG: 8.0})
    best, report = pick([MMA, TMA, TMA64, WG], run, agrees, measure)
    assert best == TMA64 and report[describe(TMA)] == 7.0


def test_a_wrong_or_failing_candidate_is_never_chosen():
    run, agrees, measure, _ = fake({MMA: 1.0, TMA: 2.0, TMA64: RuntimeError("launch failed"), WG: 1.0},
                                   {MMA: 10.0, TMA: 1.0, TMA64: 1.0, WG: 9.0})
    best, report = pick([MMA, TMA, TMA64, WG], run, agrees, measure)
    assert best == WG
    assert report[describe(TMA)] == "disagrees with the reference"
    assert report[describe(TMA64)].startswith("failed: RuntimeError")


def test_the_reference_failing_fails_tuning():
    run, agrees, measure, _ = fake({MMA: RuntimeError("no"), TMA: 1.0}, {MMA: 1.0, TMA: 1.0})
    with pytest.raises(RuntimeError):
        pick([MMA, TMA], run, agrees, measure)


def test_cache_survives_a_new_process(tmp_path):
    TuningCache(DiskCache(tmp_path)).put("k1", TMA64, {describe(TMA64): 1.5})
    assert (tmp_path / "autotune.json").is_file()
    again = TuningCache(DiskCache(tmp_path))     # what a second process sees
    assert again.get("k1") == TMA64 and again.get("k2") is None
    assert parse(describe(WG)) == WG


def test_key_separates_masks_head_dims_and_length_buckets():
    causal = maskc.load(EXAMPLES / "causal.mask")
    window = maskc.load(EXAMPLES / "sliding_window.mask")
    k = lambda b: tuning_key(b, 128, "bf16", "NVIDIA H200")  # noqa: E731
    assert k(causal.bind(seq_len=3000)) == k(causal.bind(seq_len=4096))       # same power-of-two bucket
    assert k(causal.bind(seq_len=4096)) != k(causal.bind(seq_len=4097))
    assert k(causal.bind(seq_len=4096)) != k(window.bind(seq_len=4096, window=64))
    assert tuning_key(causal.bind(seq_len=64), 64, "bf16", "x") != tuning_key(causal.bind(seq_len=64), 128, "bf16", "x")


def test_candidates_start_with_the_reference_kernel():
    hopper = forward_candidates(128, "bf16", (9, 0))
    assert hopper[0].engine == "mma" and {c.engine for c in hopper} == {"mma", "wgmma_tma"}
    assert forward_candidates(128, "bf16", (8, 0)) == (hopper[0],)        # A100: the mma kernel only
    assert {c.engine for c in forward_candidates(256, "bf16", (9, 0))} == {"mma", "wgmma_tma"}
