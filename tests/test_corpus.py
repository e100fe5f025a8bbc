"""Regression corpus (issue 17): every reproducer found by fuzzing or by hand, one .mask file each under
tests/corpus/, its first comment saying what it broke and its `# fuzz-bind: {...}` lines the bindings to
try (JSON; integers may be written as arithmetic on literals, "2**31 - 1"), or a `# fuzz-error-line: N`
line the line its compile error must point at. Each file must compile or fail
with a located MaskError, each binding bind or fail with one, and what binds gives tiles that are sound
against dense() where the dense mask is small, and a descriptor and a pair count where it is not."""
import json
import re

import numpy as np
import pytest

import maskc
from maskc.errors import MaskError

from conftest import ROOT, tile_truth
from test_fuzz_grammar import check_error

CORPUS = sorted((ROOT / "tests" / "corpus").glob("*.mask"))
_ARITHMETIC = re.compile(r"[0-9*+\- ()]+")
_DENSE_CELLS = 1 << 14


def _value(v):
    """A JSON value with integers written as literal arithmetic ("2**31 - 1") turned into ints."""
    if isinstance(v, list):
        return [_value(x) for x in v]
    if isinstance(v, str) and _ARITHMETIC.fullmatch(v):
        return int(eval(v, {"__builtins__": {}}))      # digits and operators only: checked just above
    return v


def bindings(text: str) -> list[dict]:
    return [{k: _value(v) for k, v in json.loads(line.split(":", 1)[1]).items()}
            for line in text.splitlines() if line.startswith("# fuzz-bind:")]


def test_the_corpus_is_there():
    texts = [p.read_text(encoding="utf-8-sig") for p in CORPUS]
    assert len(CORPUS) >= 10 and all(bindings(t) or _error_line(t) for t in texts)


def _error_line(text: str) -> int | None:
    lines = [line for line in text.split("\n") if line.startswith("# fuzz-error-line:")]
    return int(lines[0].split(":", 1)[1]) if lines else None


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_reproducer(path):
    text = path.read_bytes().decode("utf-8-sig")
    try:
        compiled = maskc.load(path)
    except MaskError as err:
        check_error(err, text, str(path))
        if _error_line(text) is not None:
            assert err.span is not None and err.span.line == _error_line(text), err
        return
    assert _error_line(text) is None, "this file should not compile"
    for kw in bindings(text):
        try:
            bound = compiled.bind(**kw)
        except MaskError as err:
            check_error(err, text, str(path))
            continue
        small = bound.seq_len * bound.kv_len <= _DENSE_CELLS and not compiled.ranges.uses_head
        if not small:
            try:
                bound.descriptor(128, 128)
            except MaskError as err:       # past the tile budget: refused, with a located error
                check_error(err, text, str(path))
            continue
        classes = bound.tile_map(16, 16).classes
        for b in range(bound.batch):
            truth = tile_truth(bound.dense(b), 16, 16)
            assert not np.any((classes[b] == 0) & (truth != 0)) and not np.any((classes[b] == 2) & (truth != 2))
