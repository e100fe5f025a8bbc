"""Lint: each check finds what it claims, at the user's line:col, and valid examples lint clean."""
import json
from pathlib import Path

import pytest

import maskc
from maskc.lint import Diagnostic, lint_file
from conftest import SOUND_ONLY_EXAMPLES

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.mask"))


def _lint(tmp_path, text: str) -> list[Diagnostic]:
    path = tmp_path / "m.mask"
    path.write_text(text)
    return lint_file(path)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_lint_clean(path):
    diags = lint_file(path)             # clear's disc and the image masks' // and % too: exact per chunk
    if path.stem in SOUND_ONLY_EXAMPLES:    # k in bit operations, in a table's index: warnings at the rule that say why
        line, why = {"morton_local": (11, "a bit operation on k"),
                     "tree_verify": (13, "a table entry at an index that depends on k")}[path.stem]
        assert diags and {(d.severity, d.line) for d in diags} == {("warning", line)}
        assert all("sound but not exact" in d.message and why in d.message for d in diags)
    elif maskc.load(path).ranges.uses_head:   # one tile map for every head: said once, at the first rule
        assert [d.severity for d in diags] == ["warning"] and "reads h" in diags[0].message
    else:
        assert diags == []


def test_a_mask_that_reads_h_is_told_its_tiles_are_shared_by_heads(tmp_path):
    per_head = _lint(tmp_path, "mask m(w: per h)\n  allow k <= q, q - k < w\n")
    assert [(d.line, d.col, d.severity) for d in per_head] == [(2, 3, "warning")]
    assert "one tile map serves every head" in per_head[0].message
    assert _lint(tmp_path, "mask m(w: int)\n  allow k <= q, q - k < w\n") == []


def test_unused_parameter_reported_at_its_name(tmp_path):
    diags = _lint(tmp_path, "mask m(window: int, unused: int = 3)\n  allow k <= q, q - k < window\n")
    assert [(d.line, d.col, d.severity) for d in diags] == [(1, 21, "warning")]
    assert "'unused'" in diags[0].message and "never used" in diags[0].message


def test_parameter_used_only_in_let_that_is_never_used_is_unused(tmp_path):
    diags = _lint(tmp_path, "mask m(w: int)\n  let far = q - k - w\n  allow k <= q\n")
    assert [(d.line, d.col) for d in diags] == [(1, 8)]


def test_segments_origin_and_per_arrays_count_as_uses(tmp_path):
    text = ("mask m(p: int, r: segments from p, t: per r)\n"
            "  allow same(r), k <= q, k < t(q) + r.start(q)\n")
    assert _lint(tmp_path, text) == []


def test_require_counts_as_a_use(tmp_path):
    assert _lint(tmp_path, "mask m(n: int)\n  require n >= 0\n  allow k <= q\n") == []


def test_allow_rule_that_never_holds(tmp_path):
    diags = _lint(tmp_path, "mask m()\n  allow k <= q\n  allow k < q, k > q\n  allow k < 0\n")
    assert [(d.line, d.col, d.severity) for d in diags] == [(3, 3, "warning"), (4, 3, "warning")]
    assert all("can never hold" in d.message for d in diags)


def test_deny_that_removes_nothing(tmp_path):
    diags = _lint(tmp_path, "mask m()\n  allow k <= q\n  deny k > q\n  deny k == q\n")
    assert [(d.line, d.col) for d in diags] == [(3, 3)]
    assert "removes nothing" in diags[0].message


def test_duplicate_masks_each_reported_and_linting_goes_on(tmp_path):
    text = ("mask a()\n  allow k <= q\n"
            "mask a()\n  allow k <= q\n"
            "mask a()\n  allow k <= q\n"
            "mask b(x: int)\n  allow k <= q\n")
    diags = _lint(tmp_path, text)
    assert [(d.line, d.col, d.severity) for d in diags] == [(3, 6, "error"), (5, 6, "error"), (7, 8, "warning")]
    assert "first at line 1" in diags[0].message


def test_errors_of_one_mask_do_not_hide_another(tmp_path):
    text = "mask a()\n  allow k <= qq\nmask b()\n  allow k <= q\n  deny k > q\n"
    diags = _lint(tmp_path, text)
    assert [(d.line, d.col, d.severity) for d in diags] == [(2, 14, "error"), (5, 3, "warning")]
    assert diags[0].hint == "did you mean 'q'?"


def test_parse_error_is_one_diagnostic_with_position(tmp_path):
    diags = _lint(tmp_path, "mask m()\n  allow k <= q +\n")
    assert len(diags) == 1 and diags[0].severity == "error" and (diags[0].line, diags[0].col) == (2, 17)


def test_unreadable_file_is_an_error_not_an_exception(tmp_path):
    diags = lint_file(tmp_path / "missing.mask")
    assert len(diags) == 1 and diags[0].severity == "error" and "cannot read" in diags[0].message


def test_diagnostic_text_and_dict():
    d = Diagnostic("f.mask", 3, 5, "warning", "msg", "try this")
    assert str(d) == "f.mask:3:5: warning: msg\n  hint: try this"
    assert d.as_dict() == {"file": "f.mask", "line": 3, "col": 5, "end_col": 6, "severity": "warning",
                           "message": "msg", "hint": "try this"}


def test_a_file_without_masks_is_flagged(tmp_path):
    path = tmp_path / "empty.mask"
    path.write_text("# nothing yet\n")
    diags = lint_file(path)
    assert [(d.line, d.col, d.severity) for d in diags] == [(1, 1, "warning")]
    assert "no mask" in diags[0].message


# -- every error, with carets -----------------------------------------------------------------------

def test_every_broken_line_and_rule_is_reported(tmp_path):
    text = ("mask a(w: int)\n"
            "  allow k <= q, q - k < ww\n"        # resolve error
            "  allow k <= qq\n"                   # resolve error
            "  deny k > q +\n"                    # parse error
            "mask b()\n"
            "  allow k <= zz\n"                   # resolve error in the next mask
            "mask c()\n"
            "  allow a(3)\n"                      # calls the broken mask: no echo of a's errors
            "mask d(\n")                          # a header that does not parse
    diags = _lint(tmp_path, text)
    assert [(d.line, d.severity) for d in diags] == [(2, "error"), (3, "error"), (4, "error"), (6, "error"),
                                                     (9, "error")]
    assert [d.col for d in diags[:4]] == [25, 14, 15, 14]
    assert diags[0].hint == "did you mean 'w'?"


def test_text_format_shows_the_line_and_a_caret_under_the_span(tmp_path):
    (d,) = _lint(tmp_path, "mask m()\n  allow k <= q, q - k < window\n")
    assert str(d).splitlines() == [
        f"{d.file}:2:25: error: unknown name 'window'",
        "    allow k <= q, q - k < window",
        "                          ^~~~~~"]


def test_a_mask_wide_error_is_reported_beside_rule_errors(tmp_path):
    diags = _lint(tmp_path, "mask m()\n  deny k < qq\n")
    messages = sorted(d.message for d in diags)
    assert messages == ["mask 'm' has no 'allow' rule, so it shows nothing", "unknown name 'qq'"]


# -- cancelled allows and inexact rules ---------------------------------------------------------------

def test_allow_cancelled_by_one_deny(tmp_path):
    diags = _lint(tmp_path, "mask m()\n  allow k <= q\n  allow k == q + 1\n  deny k > q\n")
    assert [(d.line, d.col) for d in diags] == [(3, 3)]
    assert "cancel" in diags[0].message and "line 4" in diags[0].message


def test_allow_cancelled_only_by_the_union_of_denies(tmp_path):
    text = "mask m()\n  allow k <= q, q - k < 8\n  deny k < q\n  deny k == q\n"
    diags = _lint(tmp_path, text)
    assert [(d.line, d.col) for d in diags] == [(2, 3)] and "lines" not in diags[0].message
    assert "line 3, 4" in diags[0].message
    assert _lint(tmp_path, "mask m()\n  allow k <= q, q - k < 8\n  deny k < q\n") == []   # the diagonal stays


def test_inexact_rule_points_at_the_nonlinear_condition(tmp_path):
    diags = _lint(tmp_path, "mask m(w: int)\n  allow k <= q, (q - k) * (q + k) < w\n")
    assert [(d.line, d.col, d.severity) for d in diags] == [(2, 17, "warning")]
    assert "not exact" in diags[0].message and "(-k + q)*(k + q): a product" in diags[0].message


@pytest.mark.parametrize("condition, col, reason", [
    ("k // 4 + k // 6 < q", 9, "(J1) // (2) and (J1) // (3) have no common chunk"),
    ("(2 * k) // 3 <= q", 9, "the coefficient 2 of k does not divide the divisor 3"),
    ("(q - k) ** 2 > 16", 9, "must be large: the keys outside a disc are two intervals"),
    ("k <= q, docs.start(k) > 3", 17, "docs.start(k) reads the segment that holds k"),
])
def test_inexact_rules_say_which_atom_and_why(tmp_path, condition, col, reason):
    diags = [d for d in _lint(tmp_path, f"mask m(docs: segments)\n  allow {condition}\n") if d.line == 2]
    assert [d.col for d in diags] == [col], [str(d) for d in diags]
    assert reason in diags[0].message


@pytest.mark.parametrize("condition", ["(q - k) ** 2 < 16", "k // 8 == q // 8", "k % 8 < 3",
                                       "(k // 8) % 4 == (q // 8) % 4, k // 32 <= q // 32",
                                       "(k % 16 - q % 16) ** 2 + (k // 16 - q // 16) ** 2 < 9"])
def test_rules_exact_per_chunk_get_no_warning(tmp_path, condition):
    assert _lint(tmp_path, f"mask m(docs: segments)\n  allow same(docs), {condition}\n") == []


@pytest.mark.parametrize("text,line,col,words", [
    ("mask m(c: const int = 0)\n  allow k // c == q // 2\n", 1, 8, "divisor"),                 # a default divisor of 0
    ("mask m(w: const int = -3)\n  require w >= 1\n  allow k <= q\n", 2, 3, "requirement"),   # a default breaks it
    ("mask m()\n  allow q - k < 2000000000 * 2000000000 * 2\n", 2, 3, "64-bit"),             # folds past 64 bits
    ("mask m()\n  allow k // 0 == q\n", 2, 14, "positive"),                                    # a literal divisor
    ("mask m()\n  allow ceildiv(k, 1 - 3) == q\n", 2, 20, "positive"),
])
def test_what_compile_refuses_lint_refuses(tmp_path, text, line, col, words):
    """A file lint passes compiles: each of these is an error of both, at the same place."""
    errors = [d for d in _lint(tmp_path, text) if d.severity == "error"]
    assert [(d.line, d.col) for d in errors] == [(line, col)] and words in errors[0].message
    with pytest.raises(maskc.MaskError) as info:
        maskc.compile_mask(text, path=str(tmp_path / "m.mask")).const_values()
    assert (info.value.span.line, info.value.span.col) == (line, col)


def test_const_parameters_without_defaults_are_not_guessed(tmp_path):
    assert _lint(tmp_path, "mask m(w: const int)\n  require w >= 1\n  allow k // w <= q // w\n") == []


def test_import_errors_are_reported_and_linting_goes_on(tmp_path):
    """A missing import, and an imported file with syntax errors, are each reported where they are (every
    broken line of the imported file), and the rest is linted in the same run: the importing file's own
    errors and warnings, and the masks of the broken file that parse (no echo of those that do not)."""
    (tmp_path / "lib.mask").write_text("mask local(w: int)\n  allow k <= q, q - k < w\n"
                                       "mask bad()\n  allow k <= q +\n"
                                       "mask worse()\n  deny k >\n  allow k <= q\n")
    main = tmp_path / "m.mask"
    main.write_text('import "lib.mask"\n'
                    'import "missing.mask"\n'
                    "mask a()\n  allow local(4)\n  allow k <= qq\n"
                    "mask b()\n  allow bad()\n"
                    "mask c(unused: int)\n  allow k <= q\n")
    diags = lint_file(main)
    lib, here = str(tmp_path / "lib.mask"), str(main)
    got = [(Path(d.file).name, d.line, d.severity) for d in diags]
    assert got == [("lib.mask", 4, "error"), ("lib.mask", 6, "error"),
                   ("m.mask", 2, "error"), ("m.mask", 5, "error"), ("m.mask", 8, "warning")], diags
    assert "missing.mask" in diags[2].message and diags[2].col == 1
    assert diags[3].hint == "did you mean 'q'?"
    assert {d.file for d in diags} == {lib, here}


# -- every mask of every file read, and files that cannot be read --------------------------------------

def _library(tmp_path) -> Path:
    """A main file calling one mask of a library whose other masks it never calls: one with an unknown name, one
    defined twice, one a warning only (an unused parameter)."""
    (tmp_path / "lib.mask").write_text("mask used(w: int)\n  allow k <= q, q - k < w\n"
                                       "mask typo()\n  allow k <= q + nosuch\n"
                                       "mask twice()\n  allow k <= q\n"
                                       "mask twice()\n  allow k >= q\n"
                                       "mask idle(x: int)\n  allow k <= q\n")
    main = tmp_path / "main.mask"
    main.write_text('import "lib.mask"\nmask main(w: int)\n  allow used(w)\n')
    return main


def test_errors_of_imported_masks_the_main_file_never_calls_are_reported(tmp_path):
    """lint checks every mask of every file it reads: the main file's and its imports', called or not, each error
    at its own file:line:col with its caret. Warnings stay the main file's (the library's come when it is linted)."""
    diags = lint_file(_library(tmp_path))
    lib = str(tmp_path / "lib.mask")
    assert [(d.file, d.line, d.col, d.severity) for d in diags] == [(lib, 4, 18, "error"), (lib, 7, 6, "error")], diags
    assert diags[0].message == "unknown name 'nosuch'"
    assert str(diags[0]).endswith("    allow k <= q + nosuch\n                   ^~~~~~")
    assert "'twice' is defined twice" in diags[1].message
    # linted itself, the library gives the same errors and its warning
    own = lint_file(tmp_path / "lib.mask")
    assert [d for d in own if d.severity == "error"] == diags
    assert [(d.line, d.severity) for d in own if d.severity == "warning"] == [(9, "warning")]


def test_an_imported_mask_error_is_reported_once_however_many_files_import_it(tmp_path):
    from click.testing import CliRunner
    from maskc.cli import cli
    main = _library(tmp_path)
    (tmp_path / "other.mask").write_text('import "lib.mask"\nmask other()\n  allow used(1)\n')
    result = CliRunner().invoke(cli, ["lint", str(main), str(tmp_path / "other.mask"), str(tmp_path / "lib.mask")])
    assert result.exit_code == 1
    assert result.stdout.count("unknown name 'nosuch'") == 1 and result.stdout.count("defined twice") == 1


def test_a_main_file_that_cannot_be_read_is_one_error_without_a_position(tmp_path):
    """No line exists to point at: the error names the path and the OS's reason, as the other commands print it."""
    from maskc.lint import render
    path = tmp_path / "missing.mask"
    [diag] = lint_file(path)
    assert (diag.line, diag.col, diag.end_col, diag.severity) == (None, None, None, "error")
    assert str(diag) == f"error: cannot read {path}: No such file or directory"
    assert render([diag], "text") == f"error: cannot read {path}: No such file or directory\n"
    assert render([diag], "github") == f"::error file={path}::cannot read {path}: No such file or directory\n"
    item = json.loads(render([diag], "json"))[0]
    assert (item["line"], item["col"], item["end_col"]) == (None, None, None)
    [directory] = lint_file(tmp_path)
    assert str(directory) == f"error: cannot read {tmp_path}: Is a directory"


def test_lint_of_a_missing_file_exits_1_and_lints_the_others(tmp_path):
    from click.testing import CliRunner
    from maskc.cli import cli
    path = tmp_path / "missing.mask"
    result = CliRunner().invoke(cli, ["lint", str(path), str(EXAMPLES[0].parent / "causal.mask")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stdout == f"error: cannot read {path}: No such file or directory\n"
    assert result.stderr == "2 file(s): 1 error(s), 0 warning(s)\n"
