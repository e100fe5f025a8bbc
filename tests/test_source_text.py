"""What counts as a .mask file's text: UTF-8 with or without a byte-order mark, lines split where the
grammar splits them (at '\\n' only), and a bounded read (issue 17, items 4 and 7)."""
import subprocess
import sys

import pytest

import maskc
from maskc.errors import MaskError, MaskFileError, MaskNameError, MaskSyntaxError, Span
from maskc.lint import lint_file
from maskc.frontend.parse import parse
from maskc.frontend.sources import MAX_SOURCE_BYTES, read_source

from conftest import EXAMPLES, ROOT

CAUSAL = (EXAMPLES / "causal.mask").read_text(encoding="utf-8")


def _error(text: str) -> MaskError:
    with pytest.raises(MaskError) as info:
        maskc.compile_mask(text, path="t.mask")
    return info.value


def test_a_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "bom.mask"
    path.write_bytes(b"\xef\xbb\xbf" + CAUSAL.encode())
    assert maskc.load(path).ranges == maskc.load(EXAMPLES / "causal.mask").ranges
    assert parse("\ufeff" + CAUSAL, "x.mask") == parse(CAUSAL, "x.mask")
    assert [d for d in lint_file(path) if d.severity == "error"] == []


def test_a_byte_order_mark_keeps_columns():
    err = _error("\ufeffmask m()\n  allow k <= nope\n")
    assert isinstance(err, MaskNameError)
    assert (err.span.line, err.span.col) == (2, 14)
    assert err.span.source_line[err.span.col - 1:].startswith("nope")


@pytest.mark.parametrize("sep", ["\f", "\v", "\x1c", "\x85", "\u2028"])
def test_a_separator_that_is_no_newline_keeps_the_caret_on_its_line(sep):
    # str.splitlines splits at these; the grammar does not, so the error's line and its text must agree
    text = f"# one{sep}two\nmask m()\n  allow k <= nope\n"
    err = _error(text)
    assert isinstance(err, MaskNameError) and err.span.line == 3
    assert err.span.source_line == "  allow k <= nope\n"
    assert err.span.source_line[err.span.col - 1:].startswith("nope")


def test_a_separator_outside_a_comment_is_refused_at_its_place():
    err = _error("mask m()\n  allow k <= q\f\n")
    assert isinstance(err, MaskSyntaxError) and (err.span.line, err.span.col) == (2, 15)


def test_a_form_feed_is_drawn_in_one_column_so_the_caret_stays_under_it():
    err = _error("mask m()\n  allow k <=\f\f nope\n")
    shown, caret = str(err).split("\n")[1:3]
    assert "\f" not in shown
    col = caret.index("^")
    assert shown[col] == "\u240c" and shown[col + 1] == "\u240c"     # points at the first form feed


def test_a_crlf_line_shows_without_its_carriage_return():
    err = _error("mask m()\r\n  allow k <= nope\r\n")
    shown, caret = str(err).split("\n")[1:3]
    assert shown.endswith("nope") and shown[caret.index("^"):] == "nope"


def test_reading_stops_at_the_size_cap(tmp_path):
    path = tmp_path / "big.mask"
    path.write_bytes(b"#" * (MAX_SOURCE_BYTES + 1))
    with pytest.raises(MaskFileError, match="larger than 1 MiB"):
        read_source(path)
    path.write_bytes(b"#" * (MAX_SOURCE_BYTES - 1) + b"\n")          # at the cap: read
    assert len(read_source(path)) == MAX_SOURCE_BYTES


@pytest.mark.parametrize("what,reason", [("nope.mask", "No such file or directory"), (".", "Is a directory")])
def test_a_file_that_cannot_be_read_is_a_file_error_not_a_syntax_error(tmp_path, what, reason):
    """maskc.load of a missing file or a directory: a MaskFileError (a MaskError, and an OSError for code that
    reads files), naming the file and why; not a MaskSyntaxError, which says the text is wrong."""
    path = tmp_path / what
    with pytest.raises(MaskFileError) as info:
        maskc.load(path)
    assert isinstance(info.value, MaskError) and isinstance(info.value, OSError)
    assert not isinstance(info.value, MaskSyntaxError)
    assert str(info.value) == f"error: cannot read {path}: {reason}"


def test_parsing_text_past_the_cap_is_refused():
    with pytest.raises(MaskSyntaxError, match="at most"):
        parse("#" * (MAX_SOURCE_BYTES + 1))


@pytest.mark.parametrize("command", ["lint", "compile", "show"])
def test_cli_on_dev_zero_stops_with_an_error(command):
    # before the cap, `maskc lint /dev/zero` read until memory ran out; the timeout only guards the test
    args = [sys.executable, "-m", "maskc", command, "/dev/zero"] + (["--seq-len", "8"] if command == "show" else [])
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    assert "larger than 1 MiB" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_a_span_without_control_characters_is_drawn_as_before():
    span = Span("f", 1, 3, 2, "\tab cd\n")
    assert span.caret() == "  \tab cd\n  \t ^~"


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_a_byte_that_is_not_utf8_is_pointed_at(tmp_path, bom):
    # a Latin-1 'é' pasted into a comment: the error names its line and column and draws the line, as a
    # syntax error does, instead of a byte offset to count by hand
    path = tmp_path / "latin1.mask"
    path.write_bytes(bom + b"mask m()\n  allow k <= q   # caf\xe9 \xe9\n")
    with pytest.raises(MaskSyntaxError) as info:
        read_source(path)
    err = info.value
    assert (err.span.file, err.span.line, err.span.col) == (str(path), 2, 23), str(err)
    assert "not UTF-8" in err.message and "0xe9" in err.message
    assert str(err).splitlines()[1:3] == ["    allow k <= q   # caf\ufffd \ufffd", "                        ^"]
    lint = [d for d in lint_file(path) if d.severity == "error"]
    assert [(d.line, d.col) for d in lint] == [(2, 23)]


def test_an_imported_file_that_is_not_utf8_is_pointed_at_in_that_file(tmp_path):
    (tmp_path / "lib.mask").write_bytes(b"mask lib()\n  allow k <= q \xff\n")
    (tmp_path / "main.mask").write_text('import "lib.mask"\nmask m()\n  allow lib()\n')
    with pytest.raises(MaskSyntaxError) as info:
        maskc.load(tmp_path / "main.mask")
    err = info.value
    assert (err.span.file, err.span.line, err.span.col) == (str(tmp_path / "lib.mask"), 2, 16), str(err)
    assert "main.mask:1:1" in err.hint           # and where it was imported


@pytest.mark.parametrize("col", [14, 100_000, 200_017])
def test_a_very_long_line_is_drawn_around_the_caret_only(col):
    # a 200,000-character line was printed whole, with as many spaces before the caret (400 KB of error)
    line = "  allow k <= q" + " + 1" * 50_000 + " +"
    span = Span("f.mask", 2, col, 3, line)
    shown, caret = span.caret().split("\n")
    assert len(shown) <= 200 and len(caret) <= 200
    assert shown[caret.index("^"):].startswith((line + " ")[col - 1:col + 2].rstrip()), (shown, caret)
    assert shown.startswith("  …") == (col > 100) and shown.endswith("…") == (col < 200_000)


def test_a_long_line_keeps_tabs_before_the_caret_in_its_window():
    line = "\t" + "x" * 300 + "\tallow"
    shown, caret = Span("f", 1, 303, 5, line).caret().split("\n")
    assert shown.endswith("\tallow") and caret.endswith("\t^~~~~")
