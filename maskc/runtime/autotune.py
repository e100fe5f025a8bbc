"""Forward tiles and engine chosen by measurement, and remembered.

The schedule (maskc.codegen.schedule) gives one answer per head dim; the fastest configuration also depends on the
mask and the lengths (a 1024-key window wants other tiles than causal at 32K, a table-heavy predicate
other register budgets). With ``Options(autotune=True)`` (or ``MASKC_AUTOTUNE=1``), the first call for
a key (mask and its compiled-in constants, head dim, dtype, GPU, lengths rounded up to a power of two)
runs every candidate of ``schedule.forward_candidates`` on that call's own inputs, drops any whose output
disagrees with the first candidate's (the mma.sync kernel, the reference) or that fails, times the rest,
and remembers the fastest: in memory and in ``<cache_dir>/autotune.json`` for later processes.

:func:`pick` is the decision alone (no GPU): it takes the candidates and two callables, so it is tested
with fakes on the CPU.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Callable, Sequence

from maskc.codegen.schedule import Tiles
from maskc.runtime.cache import TUNING_FILE, DiskCache

AGREEMENT = 2e-2        # relative L2 distance to the reference candidate's output that still counts as equal


def tuning_key(bound, head_dim: int, dtype: str, gpu: str) -> str:
    """What a tuning result is valid for: the mask (name and generated predicate, constants included),
    head dim, dtype, GPU name, and the lengths rounded up to powers of two."""
    predicate = bound.kernel_spec(head_dim=head_dim, dtype=dtype, engine="mma").predicate
    digest = hashlib.sha256(predicate.source.encode()).hexdigest()[:16]
    bucket = lambda n: 1 << max(0, (n - 1).bit_length())  # noqa: E731
    return (f"{bound.mask.name}/{digest}/d{head_dim}/{dtype}/{gpu}/"
            f"s{bucket(bound.seq_len)}/k{bucket(bound.kv_len)}")


def pick(candidates: Sequence[Tiles], run: Callable[[Tiles], object], agrees: Callable[[object, object], bool],
         measure: Callable[[Tiles], float]) -> tuple[Tiles, dict[str, float | str]]:
    """The fastest candidate whose output agrees with the first one's, and what happened to each
    (milliseconds, or why it was dropped). ``run(c)`` returns c's output (or raises); ``measure(c)`` its
    time. The first candidate is the reference: if it fails, so does tuning (RuntimeError)."""
    report: dict[str, float | str] = {}
    reference = run(candidates[0])
    best, best_ms = None, float("inf")
    for c in candidates:
        label = describe(c)
        try:
            if c is not candidates[0] and not agrees(run(c), reference):
                report[label] = "disagrees with the reference"
                continue
            ms = measure(c)
        except Exception as exc:   # noqa: BLE001  (a candidate that cannot run is simply not chosen)
            report[label] = f"failed: {type(exc).__name__}: {exc}"[:200]
            continue
        report[label] = ms
        if ms < best_ms:
            best, best_ms = c, ms
    if best is None:
        raise RuntimeError(f"autotune: no candidate could be timed: {report}")
    return best, report


def describe(tiles: Tiles) -> str:
    return f"{tiles.block_m}x{tiles.block_n}x{tiles.num_warps}:{tiles.engine}"


def parse(label: str) -> Tiles:
    shape, engine = label.split(":")
    block_m, block_n, num_warps = (int(x) for x in shape.split("x"))
    return Tiles(block_m, block_n, num_warps, engine)


class TuningCache:
    """Chosen configurations by tuning key, in memory and in the disk cache's ``autotune.json``."""

    def __init__(self, disk: DiskCache):
        self.disk = disk
        self._entries: dict[str, dict] | None = None

    def _load(self) -> dict[str, dict]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.disk.read(TUNING_FILE) or b"{}")
            except ValueError:
                self._entries = {}
        return self._entries

    def get(self, key: str) -> Tiles | None:
        entry = self._load().get(key)
        return parse(entry["choice"]) if entry else None

    def put(self, key: str, choice: Tiles, report: dict) -> None:
        self._load()[key] = {"choice": describe(choice), "report": report,
                             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.disk.write(TUNING_FILE, json.dumps(self._entries, indent=1, sort_keys=True).encode())


_caches: dict[int, TuningCache] = {}


def cache_for(disk: DiskCache) -> TuningCache:
    if id(disk) not in _caches:          # DiskCache objects live as long as the process (maskc.runtime.cache)
        _caches[id(disk)] = TuningCache(disk)
    return _caches[id(disk)]
