"""Fuzz: random and mutated text, and random parameter values, only ever raise MaskError (with a span
inside the text and a message); the CLI exits non-zero without a traceback."""
import re

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskc
from maskc.cli import cli
from maskc.errors import MaskError
from maskc.lint import lint_file

from conftest import EXAMPLES

SOURCES = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.mask"))}
TOKENS = ["mask", "allow", "deny", "require", "let", "import", "(", ")", "[", "]", ",", ":", "=", "==",
          "<", "<=", "**", "//", "%", "-", "+", "*", "not", "in", "and", "or", "q", "k", "same", "segments",
          "from", "per", "int", "\n", "\n  ", "  ", "#", "\\\n", "\"x.mask\"", "0", "-1", "99999999999", "\t",
          ".start", ".length(", "true", "min(", "clamp(", "\r\n"]


def check_error(err: MaskError, text: str):
    assert isinstance(err, MaskError)
    assert err.message and err.message.strip()
    s = str(err)
    assert "Traceback" not in s
    if err.span is not None and err.span.file == "fuzz.mask":
        lines = (text if text.endswith("\n") else text + "\n").splitlines() or [""]
        assert 1 <= err.span.line <= max(1, len(lines)), (err.span, len(lines))
        line = lines[err.span.line - 1] if err.span.line <= len(lines) else ""
        assert 1 <= err.span.col <= len(line) + 1, (err.span, line)


def compile_or_error(text: str):
    try:
        return maskc.compile_mask(text, path="fuzz.mask")
    except MaskError as err:
        check_error(err, text)
        return None


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(sorted(SOURCES)))
    text = SOURCES[name]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["del", "ins", "swap", "tok_del", "tok_ins", "tok_swap", "dup_line"]))
        if op in ("del", "ins", "swap") and text:
            i = draw(st.integers(0, len(text) - 1))
            if op == "del":
                text = text[:i] + text[i + 1:]
            elif op == "ins":
                text = text[:i] + draw(st.characters(codec="utf-8")) + text[i:]
            else:
                j = draw(st.integers(0, len(text) - 1))
                a, b = sorted((i, j))
                if a != b:
                    text = text[:a] + text[b] + text[a + 1:b] + text[a] + text[b + 1:]
        elif op.startswith("tok"):
            toks = re.findall(r"\w+|\s+|[^\w\s]", text)
            if not toks:
                continue
            i = draw(st.integers(0, len(toks) - 1))
            if op == "tok_del":
                del toks[i]
            elif op == "tok_ins":
                toks.insert(i, draw(st.sampled_from(TOKENS)))
            else:
                j = draw(st.integers(0, len(toks) - 1))
                toks[i], toks[j] = toks[j], toks[i]
            text = "".join(toks)
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines.insert(i, lines[draw(st.integers(0, len(lines) - 1))])
                text = "".join(lines)
    return text


binaryish = st.binary(max_size=200).map(lambda b: b.decode("utf-8", errors="replace"))
grammarish = st.lists(st.sampled_from(TOKENS + [" ", "m", "a", "1"]), max_size=40).map("".join)
any_text = st.one_of(st.text(max_size=200), mutated(), binaryish, grammarish,
                     st.builds(lambda h, t: h + t, st.just("mask m()\n  allow "), st.text(max_size=40)))

_HC = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture,
       HealthCheck.data_too_large]
SETTINGS = settings(suppress_health_check=_HC)


@SETTINGS
@given(text=any_text)
def test_compile_raises_only_mask_errors(text):
    compile_or_error(text)


@SETTINGS
@given(text=mutated())
def test_mutated_examples(text):
    compile_or_error(text)


@settings(max_examples=40, suppress_health_check=_HC)
@given(text=st.one_of(mutated(), st.text(max_size=120)))
def test_lint_raises_nothing(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("lint") / "fuzz.mask"
    path.write_text(text, encoding="utf-8")
    for d in lint_file(path):
        assert d.severity in ("error", "warning") and d.message
        assert d.line >= 1 and d.col >= 1
        if d.file == str(path):
            n = len(text.splitlines()) or 1
            assert d.line <= n + 1


values = st.one_of(st.integers(-5, 80), st.integers(-2**70, 2**70), st.just(0),
                   st.lists(st.integers(-3, 40), max_size=5),
                   st.lists(st.lists(st.integers(0, 30), max_size=3), min_size=1, max_size=3),
                   st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.booleans())


@SETTINGS
@given(name=st.sampled_from(sorted(SOURCES)), data=st.data())
def test_bind_random_values_raise_only_bind_errors(name, data):
    compiled = maskc.load(EXAMPLES / name)
    names = [p.name for p in compiled.params] + ["bogus"]
    kw = {n: data.draw(values) for n in data.draw(st.lists(st.sampled_from(names), unique=True))}
    seq_len = data.draw(st.one_of(st.integers(1, 40), st.integers(-2, 0), st.just(3.0)))
    kv_len = data.draw(st.one_of(st.none(), st.integers(-1, 40)))
    try:
        bound = compiled.bind(seq_len, kv_len, **kw)
    except MaskError as err:
        check_error(err, "")
        return
    # a successful bind must be usable
    try:
        bound.tile_map(16, 16)
        bound.descriptor(16, 16)
        bound.dense()
    except MaskError as err:
        check_error(err, "")


@settings(max_examples=25, suppress_health_check=_HC)
@given(text=st.one_of(mutated(), st.text(max_size=80)))
def test_cli_lint_and_compile_exit_nonzero_without_traceback(tmp_path_factory, text):
    compiled = compile_or_error(text)
    try:                                   # what lint checks: every mask of the file, or none
        from maskc.pipeline import compile_all
        compile_all_ok = compile_all_text(text)
    except MaskError:
        compile_all_ok = False
    path = tmp_path_factory.mktemp("cli") / "fuzz.mask"
    path.write_text(text, encoding="utf-8")
    runner = CliRunner()
    for args in (["lint", str(path)], ["compile", str(path), "-o", str(path.with_suffix(".cu"))]):
        result = runner.invoke(cli, args)
        out = result.output + (result.stderr if result.stderr_bytes is not None else "")
        assert "Traceback" not in out
        assert "internal error" not in out, out
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
            repr(result.exception)
        failed = compiled is None if args[0] == "compile" else not compile_all_ok
        if failed:
            assert result.exit_code != 0, (args, out)
            assert "error" in out


def compile_all_text(text: str) -> bool:
    from maskc.pipeline import compile_program, program_from_text
    from maskc.frontend.resolve import resolve_all
    from maskc.analysis.normalize import normalize
    program = program_from_text(text, "fuzz.mask")
    names = [m.name for m in program.main.masks]
    if len(set(names)) != len(names):
        return False
    for n in names:
        compile_program(program, n)
    return True


def test_huge_literal_is_a_mask_error():
    c = compile_or_error("mask m()\n  allow k <= 99999999999999999999999\n")
    if c is not None:
        c.bind(5).dense()


def test_deep_nesting_is_a_mask_error():
    compile_or_error("mask m()\n  allow " + "(" * 300 + "k" + ")" * 300 + " <= q\n")


@pytest.mark.parametrize("text", ["\x00", "mask m()\n  allow k <= q\x00\n", "\ufeffmask m()\n  allow k <= q\n",
                                  "mask m()\r\n  allow k <= q\r\n", "mask m()\n\tallow k <= q\n",
                                  "mask m()\n  allow k <= 9999999999\n",
                                  "mask m()\n  allow " + "(" * 150 + "k" + ")" * 150 + " <= q\n",
                                  "mask m()\n  allow " + " or ".join(f"k == {i}" for i in 20 * [0]) + "\n"])
def test_hand_picked_nasty_inputs(text):
    c = compile_or_error(text)
    if c is not None:
        c.bind(5).dense()
