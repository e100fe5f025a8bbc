"""Fuzz with grammar-built files and parameter values at the int32/int64 edges (issue 17).

Every input ends in a result or a located MaskError, never another exception: files built from the
grammar's productions (:mod:`fuzz_strategies`), shapes that grow under inlining and normalization, and every
example and every grammar-built mask that compiles bound with values near 0, 2**31, 2**32, 2**63 and 2**64.
What binds at a small size has sound tiles against dense() (EMPTY and FULL tiles are what they say).

Each test runs twice: a short run in the default suite, and a long one marked ``slow``::

    python -m pytest -m slow tests/test_fuzz_grammar.py

The session's summary prints how many inputs ran and how many failed a check.
"""
import collections
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

import maskc
from maskc.cli import cli
from maskc.errors import MaskError

from conftest import EXAMPLES, tile_truth
from fuzz_strategies import chain_file, edge_int, grammar_file

SOURCES = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.mask"))}
EXAMPLE_MASKS = {p.name: maskc.load(p) for p in sorted(EXAMPLES.glob("*.mask"))}
_HC = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


def check_error(err: MaskError, text: str, path: str = "fuzz.mask") -> None:
    """A MaskError with a message, no traceback, and a span inside the text (lines as the grammar counts
    them: at '\n' only)."""
    assert isinstance(err, MaskError) and err.message.strip()
    assert "Traceback" not in str(err)
    if err.span is not None and err.span.file == path:
        lines = (text if text.endswith("\n") else text + "\n").split("\n")[:-1] or [""]
        assert 1 <= err.span.line <= len(lines), (err.span, len(lines))
        assert 1 <= err.span.col <= len(lines[err.span.line - 1]) + 1, (err.span, lines[err.span.line - 1])


def compile_or_error(text: str):
    try:
        return maskc.compile_mask(text, path="fuzz.mask")
    except MaskError as err:
        check_error(err, text)
        return None


RUN = collections.Counter()          # inputs run per fuzz test, for the summary line
FAILED = collections.Counter()       # of those, inputs that failed a check (shrinking runs count too)


def summary() -> str | None:
    """The line the session's summary prints (tests/conftest.py), once a fuzz test ran."""
    if not RUN:
        return None
    return (f"fuzz: {sum(RUN.values())} inputs run, {sum(FAILED.values())} failed a check "
            f"({', '.join(f'{n} {k}' for k, n in sorted(RUN.items()))})")


def fuzz(strategy, ci: int, long: int):
    """A test that runs ``check`` on ``ci`` drawn inputs, and on ``long`` in the ``slow`` run."""
    def wrap(check):
        @pytest.mark.parametrize("examples", [pytest.param(ci, id="ci"),
                                              pytest.param(long, id="long", marks=pytest.mark.slow)])
        def test(examples):
            @settings(max_examples=examples, deadline=None, suppress_health_check=_HC, database=None)
            @given(strategy)
            def run(value):
                try:
                    check(value)
                except HypothesisException:     # a draw past Hypothesis's budget: not an input that ran
                    raise
                except Exception:
                    RUN[check.__name__] += 1
                    FAILED[check.__name__] += 1
                    raise
                RUN[check.__name__] += 1
            run()
        test.__name__ = check.__name__
        test.__doc__ = check.__doc__
        return test
    return wrap


def _edge_value(param, data, seq_len: int):
    """A value for one parameter: edge integers; for segments and per-segment arrays, lists of them, or
    (half the time) lengths that partition a small seq_len, as bind accepts."""
    if param.kind == "int":
        return data.draw(st.one_of(edge_int(), st.integers(-5, 40)))
    if param.kind == "segments" and 0 < seq_len <= 64 and data.draw(st.booleans()):
        cuts = sorted(data.draw(st.lists(st.integers(0, seq_len), max_size=4)))
        return [b - a for a, b in zip([0] + cuts, cuts + [seq_len])]
    return data.draw(st.lists(st.one_of(edge_int(), st.integers(0, 20)), max_size=4))


def _bind_and_check(compiled, data, text: str = ""):
    """Bind with drawn values (mostly edges): a BindError, or a bound mask whose tiles, descriptor and
    visible-pair count agree with dense() at small sizes; at sizes past the tile budget, a BindError."""
    seq_len = data.draw(st.one_of(st.integers(1, 24), edge_int()))
    if compiled.resolved.requires and 2 ** 20 < seq_len <= 2 ** 31 - 1:
        seq_len = 2 ** 20           # `require` is checked at every query position: O(seq_len), minutes at 2**31
    kv_len = data.draw(st.one_of(st.none(), st.integers(1, 24), edge_int()))
    values = {p.name: _edge_value(p, data, seq_len) for p in compiled.params if data.draw(st.integers(0, 4))}
    heads = data.draw(st.one_of(st.none(), st.integers(1, 3), edge_int())) if compiled.ranges.uses_head else None
    try:
        bound = compiled.bind(seq_len, kv_len, num_heads=heads, **values)
    except MaskError as err:
        check_error(err, text)
        return
    block_m, block_n = data.draw(st.sampled_from([(1, 1), (4, 8), (16, 16), (64, 128), (128, 128)]))
    grid = -(-bound.seq_len // block_m) * -(-bound.kv_len // block_n) * bound.batch * (bound.num_heads or 1)
    small = bound.seq_len * bound.kv_len <= 4096 and (bound.num_heads or 1) <= 4
    if not small and grid <= 2 ** 30:
        return                      # dense() is the oracle: small sizes only; past 2**30 tiles, an error
    try:
        classes = bound.tile_map(block_m, block_n).classes
        bound.descriptor(block_m, block_n)
    except MaskError as err:
        check_error(err, text)
        return
    assert small, f"a tile grid of {grid} tiles was built"
    total = 0
    for b in range(bound.batch):
        dense = bound.dense(b)
        total += int(dense.sum())
        truth = tile_truth(dense, block_m, block_n)
        # sound always: EMPTY and FULL tiles are what they say (PARTIAL may cover either)
        assert not np.any((classes[b] == 0) & (truth != 0)) and not np.any((classes[b] == 2) & (truth != 2))
    if not compiled.ranges.uses_head:
        assert bound.visible_pairs() == total


def _compile_and_bind(data, text):
    compiled = compile_or_error(text)
    if compiled is not None:
        _bind_and_check(compiled, data, text)


@fuzz(st.data(), ci=400, long=25000)
def test_fuzz_grammar_files(data):
    """Files built from the grammar's productions compile or fail with a located MaskError; what compiles
    binds (edge values) or fails with a BindError, and its tiles are sound against dense()."""
    _compile_and_bind(data, data.draw(grammar_file()))


@fuzz(st.data(), ci=300, long=20000)
def test_fuzz_example_parameters_at_the_edges(data):
    """Every example mask bound with parameter values at the int32/int64 edges."""
    name = data.draw(st.sampled_from(sorted(EXAMPLE_MASKS)))
    _bind_and_check(EXAMPLE_MASKS[name], data, SOURCES[name])


@fuzz(chain_file(), ci=40, long=3000)
def test_fuzz_growth_shapes(text):
    """Let chains that double, nested abs, min/max towers, powers: a result or a MaskError, never a hang in
    normalization or a RecursionError."""
    compile_or_error(text)


@fuzz(st.tuples(st.sampled_from(["compile", "lint", "show", "explain"]), grammar_file()),
      ci=30, long=2000)
def test_fuzz_cli(args):
    """The commands on fuzzed files: exit 0, 1 or 2 with a message, never an internal error."""
    command, text = args
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.mask"
        path.write_text(text, encoding="utf-8")
        argv = {"compile": ["compile", str(path), "-o", str(path.with_suffix(".cu"))],
                "lint": ["lint", str(path)],
                "show": ["show", str(path), "--seq-len", "40", "--block-m", "8", "--block-n", "8"],
                "explain": ["explain", str(path)]}[command]
        result = CliRunner().invoke(cli, argv)
    out = result.output
    assert "Traceback" not in out and "internal error" not in out, out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2) and (result.exit_code == 0 or "error" in out.lower()), out
