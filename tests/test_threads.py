"""Loading, compiling and binding from several threads at once gives each thread exactly what one
thread alone gets (issue 17, item 5: the parser's indenter was shared, and 8 threads parsing at once
failed about a third of the time)."""
import os
import threading

import numpy as np
import pytest

import maskc
from maskc.frontend.parse import parse

from conftest import EXAMPLE_NAMES, EXAMPLES, example_params

THREADS = 8


def _work_items():
    """(kind, example name, bind kwargs) for every example: a parse, a load, a compile and a bind."""
    rng = np.random.default_rng(17)
    items = []
    for name in EXAMPLE_NAMES:
        items += [("parse", name, None), ("load", name, None), ("compile", name, None),
                  ("bind", name, example_params(name, 96, rng))]
    return items


def _run(kind: str, name: str, kw):
    """One operation's result, in a form two runs can be compared by."""
    path = EXAMPLES / f"{name}.mask"
    if kind == "parse":
        return parse(path.read_text(encoding="utf-8"), str(path))
    if kind == "load":
        return repr(maskc.load(path).ranges)
    if kind == "compile":
        return repr(maskc.compile_mask(path.read_text(encoding="utf-8"), path=str(path), base_dir=EXAMPLES).ranges)
    bound = maskc.load(path).bind(96, **kw)
    return bound.dense().tobytes() + bound.tiles(16, 32).tobytes()


def _hammer(operations: int) -> list[str]:
    """``operations`` operations spread over 8 threads started together; the failures, described."""
    items = _work_items()
    expected = [_run(*item) for item in items]             # one thread alone: the oracle
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def worker(t: int):
        start.wait()
        for i in range(t, operations, THREADS):
            j = (i * 7 + t) % len(items)
            try:
                got = _run(*items[j])
            except Exception as err:   # noqa: BLE001 - any exception is a failure we count
                failures.append(f"{items[j][:2]}: {type(err).__name__}: {err}")
                continue
            if got != expected[j]:
                failures.append(f"{items[j][:2]}: a different result")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return failures


def test_eight_threads_parse_the_same_text_at_once():
    text = (EXAMPLES / "hstu.mask").read_text(encoding="utf-8")
    expected = parse(text, "hstu.mask")
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def worker():
        start.wait()
        for _ in range(40):
            try:
                if parse(text, "hstu.mask") != expected:
                    failures.append("a different tree")
            except Exception as err:  # noqa: BLE001
                failures.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []


def test_eight_threads_load_compile_and_bind():
    failures = _hammer(800)
    assert failures == [], f"{len(failures)} of 800 failed; first: {failures[:3]}"


@pytest.mark.slow
def test_eight_threads_ten_thousand_operations():
    failures = _hammer(int(os.environ.get("MASKC_THREAD_OPS", "10000")))
    assert failures == [], f"{len(failures)} failed; first: {failures[:3]}"
