"""Parse: every example parses, spans point at their text, syntax errors point at the culprit."""
import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

import maskc
from maskc import ir
from maskc.errors import MaskError, MaskSyntaxError
from maskc.frontend.parse import parse, parse_file

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.mask"))

_EXPR_NODES = (ir.Num, ir.Name, ir.BoolLit, ir.BinOp, ir.UnaryMinus, ir.Call, ir.MethodCall,
               ir.Compare, ir.InRange, ir.BoolOp, ir.Not)


def _nodes(node):
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        yield node
        for f in dataclasses.fields(node):
            if f.name == "span":
                continue
            v = getattr(node, f.name)
            for x in (v if isinstance(v, tuple) else (v,)):
                yield from _nodes(x)


def _text(span):
    return span.source_line[span.col - 1: span.col - 1 + span.length]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses_and_compiles(path):
    f = parse_file(path)
    assert f.masks, "an example defines at least one mask"
    assert f.path == str(path)
    for m in f.masks:
        assert m.rules
    maskc.load(path)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_spans_point_at_their_text(path):
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    f = parse(text, str(path))
    checked = 0
    for m in f.masks:
        for node in _nodes(m):
            span = node.span
            assert span.file == str(path)
            assert 1 <= span.line <= len(lines)
            assert span.source_line == lines[span.line - 1]
            assert 1 <= span.col <= len(span.source_line)
            t = _text(span)
            if isinstance(node, (ir.MaskDecl, ir.ParamDecl, ir.LetDecl)):
                assert t == node.name
            elif isinstance(node, ir.Name):
                assert t == node.id
            elif isinstance(node, ir.Num):
                assert t == str(node.value)
            elif isinstance(node, ir.Call):
                assert t.startswith(node.func + "(") and t.endswith(")")
            elif isinstance(node, ir.MethodCall):
                assert t.startswith(f"{node.obj}.{node.method}(") and t.endswith(")")
            elif isinstance(node, ir.RuleDecl):
                assert t.startswith(node.kind + " ")
            elif isinstance(node, ir.ImportDecl):
                assert t.startswith("import")
            if isinstance(node, _EXPR_NODES) and not isinstance(node, ir.Arg):
                # The span's text, parsed on its own, is the same expression (spans take no part
                # in equality), so the span covers exactly that node.
                again = parse(f"mask m()\n  allow ({t})\n").masks[0].rules[0].conditions[0]
                assert again == node, (t, node)
                checked += 1
    assert checked > 0


def test_spans_of_a_handwritten_mask():
    text = ("mask  win(w: int = 4, docs: segments)\n"
            "  let d(i) = q - i\n"
            "  allow same(docs), d(k) < w\n"
            "  deny k in [0, 2)\n")
    f = parse(text, "w.mask")
    m = f.masks[0]
    assert (m.span.line, m.span.col, m.span.length) == (1, 7, 3)
    assert [(p.name, p.span.col) for p in m.params] == [("w", 11), ("docs", 23)]
    assert m.params[0].default == ir.Num(4)
    let = m.lets[0]
    assert (let.span.line, let.span.col) == (2, 7) and let.args == ("i",)
    allow, deny = m.rules
    assert (allow.span.line, allow.span.col) == (3, 3)
    same, cmp_ = allow.conditions
    assert isinstance(same, ir.Call) and (same.span.col, same.span.length) == (9, 10)
    assert isinstance(cmp_, ir.Compare) and (cmp_.span.col, cmp_.span.length) == (21, 8)
    rng = deny.conditions[0]
    assert isinstance(rng, ir.InRange) and rng.low_closed and not rng.high_closed and not rng.negated
    assert (rng.span.line, rng.span.col) == (4, 8)


def test_rule_span_stops_before_a_trailing_comment():
    f = parse("mask m()\n  allow k <= q   # causal\n")
    rule = f.masks[0].rules[0]
    assert _text(rule.span).rstrip() == "allow k <= q"


# (name, text, line, col, words in the message)
MALFORMED = [
    ("missing_paren", "mask m(a: int\n  allow k <= q\n", 2, 3, "unexpected 'allow'"),
    ("eq_not_eqeq", "mask m()\n  allow k = q\n", 2, 11, "'='"),
    ("unindented_rule", "mask m()\nallow k <= q\n", 2, 1, "unexpected 'allow'"),
    ("stray_character", "mask m()\n  allow k <= q $\n", 2, 16, "'$'"),
    ("keyword_as_mask_name", "mask allow()\n  allow k <= q\n", 1, 6, "'allow'"),
    ("keyword_as_param", "mask m(in: int)\n  allow k <= q\n", 1, 8, "'in'"),
    ("bad_range_bracket", "mask m()\n  allow k in [0, q}\n", 2, 19, "'}'"),
    ("trailing_comma_rule", "mask m()\n  allow k <= q,\n", 2, 16, "end of the line"),
    ("double_comma_params", "mask m(a: int,, c: int)\n  allow k <= q\n", 1, 15, "','"),
    ("leading_comma_params", "mask m(, a: int)\n  allow k <= q\n", 1, 8, "','"),
    ("double_comma_call", "mask m()\n  allow min(k,, q) <= q\n", 2, 15, "','"),
    ("missing_rhs", "mask m()\n  allow k <=\n", 2, 13, "end of the line"),
    ("let_keyword_name", "mask m()\n  let not = 3\n  allow k <= q\n", 2, 7, "'not'"),
    ("range_missing_comma", "mask m()\n  allow k in [0 q)\n", 2, 17, "'q'"),
    ("stray_at_second_mask", "mask a()\n  allow k <= q\nmask b()\n  allow k @ q\n", 4, 11, "'@'"),
    # a misspelt keyword is named, with the keyword it is closest to, at the misspelt word
    ("typo_allow", "mask m()\n  alow k <= q\n", 2, 3, "unknown keyword `alow`; did you mean `allow`?"),
    ("typo_require", "mask m(n: int)\n  requre n > 0\n  allow k <= q\n", 2, 3,
     "unknown keyword `requre`; did you mean `require`?"),
    ("typo_deny_call", "mask m()\n  allow k <= q\n  dney(k == 0)\n", 3, 3, "did you mean `deny`?"),
    ("typo_let", "mask m()\n  lte x = 3\n  allow k <= x\n", 2, 3, "did you mean `let`?"),
    ("typo_mask", "msk m()\n  allow k <= q\n", 1, 1, "unknown keyword `msk`; did you mean `mask`?"),
    ("typo_import", 'imprt "x.mask"\nmask m()\n  allow k <= q\n', 1, 1, "did you mean `import`?"),
    ("typo_type", "mask m(n: itn)\n  allow k <= q\n", 1, 11, "unknown keyword `itn`; did you mean `int`?"),
    ("typo_over", "mask m(d: segments ovr k)\n  allow k <= q\n", 1, 20, "did you mean `over`?"),
    ("typo_and", "mask m()\n  allow k <= q adn k > 0\n", 2, 16, "unknown keyword `adn`; did you mean `and`?"),
]


@pytest.mark.parametrize("name,text,line,col,words", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_syntax_errors_name_file_line_col_with_caret(name, text, line, col, words):
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask(text, path="bad.mask")
    err = info.value
    s = str(err)
    assert s.startswith(f"bad.mask:{line}:{col}: error: "), s
    assert words in err.message
    assert "Traceback" not in s
    src, caret = s.splitlines()[1:3]
    # the caret line sits under the source line, the caret at the column
    assert src == "  " + text.splitlines()[line - 1]
    assert caret.index("^") == col + 1
    assert caret.strip().startswith("^")


@given(st.sampled_from(["allow", "deny", "require", "let"]), st.data())
def test_a_misspelt_statement_keyword_is_named_where_it_is(keyword, data):
    """Any one-letter slip (dropped, doubled, swapped with the next) in the word that starts a body line is an
    error naming the word and the keyword, at the word; never Lark's generic message."""
    i = data.draw(st.integers(0, len(keyword) - 1))
    slip = data.draw(st.sampled_from(["drop", "double", "swap"]))
    word = {"drop": keyword[:i] + keyword[i + 1:], "double": keyword[:i] + keyword[i] + keyword[i:],
            "swap": keyword[:i] + keyword[i + 1:i + 2] + keyword[i] + keyword[i + 2:]}[slip]
    assume(word != keyword and len(word) > 1)
    rest = "x = 3" if keyword == "let" else "k <= q"
    text = f"mask m()\n  allow k <= q\n  {word} {rest}\n"
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask(text, path="bad.mask")
    s = str(info.value)
    assert s.startswith("bad.mask:3:3: error: "), s
    assert f"unknown keyword `{word}`" in s and f"`{keyword}`" in s, s
    assert s.splitlines()[2].strip() == "^" + "~" * (len(word) - 1), s


# Where each keyword stands ({K}) in a mask that compiles; the test below runs a longer word in its place.
KEYWORD_PLACES = {
    "import": '{K} "a.mask"\nmask m()\n  allow k <= q\n',
    "mask": "{K} m()\n  allow k <= q\n",
    "int": "mask m(n: {K} = 1)\n  allow k <= q\n",
    "const": "mask m(n: {K} int = 1)\n  allow k <= q\n",
    "segments": "mask m(d: {K})\n  allow k <= q\n",
    "over": "mask m(d: segments {K} k)\n  allow k <= q\n",
    "from": "mask m(d: segments {K} 0)\n  allow k <= q\n",
    "per": "mask m(d: segments, v: {K} d)\n  allow k <= q\n",
    "table": "mask m(t: {K})\n  allow k <= q\n",
    "float": "mask m(c: {K} = 1.0)\n  allow k <= q\n  score = score * c\n",
    "let": "mask m()\n  {K} y = 3\n  allow k <= y\n",
    "require": "mask m(n: int = 1)\n  {K} n > 0\n  allow k <= q\n",
    "allow": "mask m()\n  {K} k <= q\n",
    "deny": "mask m()\n  allow k <= q\n  {K} k == 0\n",
    "or": "mask m()\n  allow k <= q {K} k > 0\n",
    "and": "mask m()\n  allow k <= q {K} k > 0\n",
    "not": "mask m()\n  allow k {K} in [0, 3]\n",
    "in": "mask m()\n  allow k {K} [0, 3]\n",
    "true": "mask m()\n  allow {K}\n",
    "false": "mask m()\n  allow k <= q\n  deny {K}\n",
}


def _grammar_keywords() -> set[str]:
    """The grammar's keywords, read from its text: quoted words ("int") and words before \\b (/int\\b/)."""
    text = (Path(__file__).parent.parent / "grammars" / "mask.lark").read_text()
    text = "\n".join(line.split("//")[0] for line in text.splitlines() if not line.startswith("NAME"))
    quoted = set(re.findall(r'"([a-z]+)"', text))
    bounded = {w for group in re.findall(r"/\(?([a-z|]+)\)?\\b/", text) for w in group.split("|")}
    return quoted | bounded


def test_every_keyword_has_a_place_in_the_test_below():
    assert _grammar_keywords() == set(KEYWORD_PLACES), _grammar_keywords() ^ set(KEYWORD_PLACES)


@pytest.mark.parametrize("keyword", sorted(KEYWORD_PLACES))
@pytest.mark.parametrize("tail", ["x", "s", "_", "2"])
def test_a_keyword_with_more_letters_is_one_word(keyword, tail):
    """``intt`` is one word, never ``int`` then ``t``: where the keyword stands, the longer word is an error that
    names it whole, at its column; where a name stands, it is a name."""
    text = KEYWORD_PLACES[keyword]
    if keyword != "import":           # the place compiles with the keyword itself
        maskc.compile_mask(text.format(K=keyword), path="kw.mask")
    word = keyword + tail
    line_no, line = next((i, ln) for i, ln in enumerate(text.splitlines(), 1) if "{K}" in ln)
    with pytest.raises(MaskError) as info:
        maskc.compile_mask(text.format(K=word), path="kw.mask")
    err = info.value
    assert f"`{word}`" in err.message or f"'{word}'" in err.message, err.message
    assert (err.span.line, err.span.col) == (line_no, line.index("{K}") + 1), str(err)
    # as a name: a parameter so named, read by a rule
    named = maskc.compile_mask(f"mask m({word}: int = 1)\n  allow k <= q + {word}\n", path="kw.mask")
    assert [p.name for p in named.resolved.params] == [word]


# Common slips: (name, text, line, col, the message's words). What was expected is said in a user's words, and the
# end of a line is never offered where lines are joined (inside brackets).
COMMON_SLIPS = [
    ("missing_rsqb", "mask m(t: table)\n  allow k <= t[q\n", 2, 17,
     "found the end of the file; expected ']' to close the '[' at 2:15"),
    ("missing_rsqb_range", "mask m()\n  allow k in [0, 3\n", 2, 19, "expected ']' to close the '[' at 2:14"),
    ("missing_rpar_call", "mask m()\n  allow k <= min(q, 3\n", 2, 22, "expected ')' to close the '(' at 2:17"),
    ("missing_rpar_group", "mask m()\n  allow (k <= q\n  deny k == 0\n", 3, 3,
     "unexpected 'deny'; expected ')' to close the '(' at 2:9"),
    ("missing_rpar_params", "mask m(a: int\n  allow k <= q\n", 2, 3,
     "unexpected 'allow'; expected ')' to close the '(' at 1:7"),
    ("trailing_plus", "mask m()\n  allow k <= q +\n", 2, 17,
     "found the end of the line; expected a value after '+' (a name, a number or '(')"),
    ("trailing_comparison", "mask m()\n  allow k <=\n", 2, 13, "found the end of the line; expected a value after '<='"),
    ("trailing_and", "mask m()\n  allow k <= q and\n", 2, 19, "found the end of the line; expected a value after 'and'"),
    ("operator_twice", "mask m()\n  allow k <= * q\n", 2, 14, "unexpected '*'; expected a value after '<='"),
    ("missing_operator", "mask m()\n  allow k q\n", 2, 11,
     "unexpected 'q'; expected an operator, a comparison, ',' or the end of the line"),
    ("subscript_missing_comma", "mask m(t: table)\n  allow k <= t[q q]\n", 2, 18,
     "unexpected 'q'; expected an operator, ',' or ']'"),
    ("unknown_statement", "mask m()\n  permit k <= q\n", 2, 3,
     "unknown keyword `permit`; a line of a mask starts with allow, deny, require, let or `score =`"),
    ("unknown_statement_later", "mask m()\n  allow k <= q\n  forbid k == 0\n", 3, 3, "unknown keyword `forbid`"),
    ("missing_type", "mask m(n: )\n  allow k <= q\n", 1, 11,
     "unexpected ')'; expected a type ('int', 'const int', 'float', 'segments', 'per', 'table')"),
    ("let_without_eq", "mask m()\n  let x 3\n  allow k <= x\n", 2, 9, "unexpected '3'; expected '(' or '='"),
    ("stray_character_after_operator", "mask m()\n  allow k <= $\n", 2, 14,
     "unexpected character '$'; expected a value after '<='"),
]


@pytest.mark.parametrize("name,text,line,col,words", COMMON_SLIPS, ids=[c[0] for c in COMMON_SLIPS])
def test_common_slips_say_what_was_expected(name, text, line, col, words):
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask(text, path="bad.mask")
    s = str(info.value)
    assert s.startswith(f"bad.mask:{line}:{col}: error: "), s
    assert words in info.value.message, s
    if "end of the line" not in words:      # not offered where it cannot stand (inside brackets, after 'let x')
        assert "end of the line" not in s, s
    src, caret = s.splitlines()[1:3]
    assert src == "  " + text.splitlines()[line - 1] and caret.index("^") == col + 1, s


def test_eq_instead_of_eqeq_hints_double_equals():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\n  allow k = q\n")
    assert info.value.hint and "==" in info.value.hint


@pytest.mark.parametrize("rule,hint", [
    ("k =< q", "'<='"), ("k => q", "'>='"), ("k = q", "'=='"),
    ("k <= q && k > 0", "'and'"), ("k <= q || k == 0", "'or'"), ("!(k > q)", "'not'"),
])
def test_operators_from_other_languages_hint_the_one_meant(rule, hint):
    # `=<` asked for `==` before; `&&`, `||` and `!` said only what they were not
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask(f"mask m()\n  allow {rule}\n")
    assert info.value.hint and hint in info.value.hint, (str(info.value), hint)


def test_over_indented_rule_hints_indentation():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\n  allow k <= q\n      allow k <= q\n")
    assert "indent" in (info.value.hint or "")


def test_an_indented_line_is_underlined_as_its_first_word():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\n  allow k <= q\n      allow k <= q\n")
    assert (info.value.span.col, info.value.span.length) == (7, 5)      # 'allow', not the indentation's width


@pytest.mark.parametrize("text", ["mask m()\n  allow k <= q\n\tdeny k == 0\n",
                                  "mask m()\n\tallow k <= q\n  \tdeny k == 0\n"])
def test_tabs_among_spaces_hint_that_they_do_not_line_up(text):
    # the hint said only that rules are indented once, with both lines indented once as the user sees them
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask(text)
    assert info.value.span.line == 3 and "tab" in (info.value.hint or ""), str(info.value)


@pytest.mark.parametrize("rule,typed", [("k\u00a0<= q", "a plain space"), ("k ≤ q", "'<='"), ("k ≠ q", "'!='"),
                                        ("k <= q − 1", "'-'"), ("k <= q\u200b", "delete it")])
def test_characters_of_formatted_text_say_what_to_type(rule, typed):
    # a no-break space or '≤' pasted from a paper was only an 'unexpected character'
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask(f"mask m()\n  allow {rule}\n")
    assert typed in (info.value.hint or ""), str(info.value)
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask('import “other.mask”\nmask m()\n  allow k <= q\n')
    assert "'\"'" in (info.value.hint or ""), str(info.value)


def test_carriage_returns_alone_hint_at_the_line_endings():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\r  allow k <= q\r")
    assert "'\\r'" in (info.value.hint or ""), str(info.value)


def test_over_indented_rule_points_at_that_line():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\n  allow k <= q\n      allow k <= q\n", path="bad.mask")
    assert info.value.span.line == 3


def test_inconsistent_dedent_points_at_that_line():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\n    allow k <= q\n  allow k <= q\n", path="bad.mask")
    assert info.value.span.line == 3
    assert "dedent" not in info.value.message.lower() or "Expected" not in info.value.message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_file_without_a_mask_is_an_error(text):
    with pytest.raises(MaskError) as info:
        maskc.compile_mask(text, path="empty.mask")
    assert "0 masks" in info.value.message or "no mask" in info.value.message
    assert "empty.mask" in str(info.value)


def test_file_without_a_mask_names_file_line_col():
    with pytest.raises(MaskError) as info:
        maskc.compile_mask("# nothing here\n", path="empty.mask")
    assert str(info.value).startswith("empty.mask:1:1: error:")
    assert "-m" not in info.value.message


def test_trailing_commas_allowed_in_params_and_calls():
    c = maskc.compile_mask("mask m(a: int, w: int = 2,)\n  allow k <= q, q - k < max(a, w,)\n")
    d = c.bind(12, a=3).dense()
    q, k = [x for x in __import__("numpy").indices((12, 12))]
    assert (d == ((k <= q) & (q - k < 3))).all()


def test_comments_everywhere():
    text = ("# leading comment\n\n"
            "mask m(a: int, # inside the parameter list\n"
            "       w: int = 3) # after the header\n"
            "  # before a rule\n"
            "  let x = (a + # inside parentheses\n"
            "           w)\n"
            "  allow k <= q, q - k < x # after a rule\n"
            "    # a deeper comment line\n"
            "\n"
            "  deny k == a # another\n"
            "# trailing comment without newline")
    plain = "mask m(a: int, w: int = 3)\n  let x = (a + w)\n  allow k <= q, q - k < x\n  deny k == a\n"
    with_comments, without = parse(text).masks[0], parse(plain).masks[0]
    assert with_comments == without
    import numpy as np
    a = maskc.compile_mask(text).bind(16, a=2).dense()
    b = maskc.compile_mask(plain).bind(16, a=2).dense()
    assert np.array_equal(a, b) and a.any()


def test_hash_inside_comment_only_file_with_mask_after():
    f = parse("# a\n# b\nmask m()   # c\n  allow k <= q  # d\n")
    assert [m.name for m in f.masks] == ["m"]


def test_comparison_chains():
    f = parse("mask m(a: int)\n  allow 0 <= k < q <= a\n")
    cmp_ = f.masks[0].rules[0].conditions[0]
    assert isinstance(cmp_, ir.Compare)
    assert cmp_.ops == ("<=", "<", "<=") and len(cmp_.operands) == 4
    import numpy as np
    d = maskc.compile_mask("mask m(a: int)\n  allow 0 <= k < q <= a\n").bind(10, a=6).dense()
    q, k = np.indices((10, 10))
    assert np.array_equal(d, (0 <= k) & (k < q) & (q <= 6))
    d2 = maskc.compile_mask("mask m()\n  allow k < q > 3\n").bind(8).dense()
    assert np.array_equal(d2, (k[:8, :8] < q[:8, :8]) & (q[:8, :8] > 3))


def test_precedence_and_or_not():
    import numpy as np
    d = maskc.compile_mask("mask m()\n  allow not k > q and q < 4 or k == 0\n").bind(9).dense()
    q, k = np.indices((9, 9))
    assert np.array_equal(d, ((~(k > q)) & (q < 4)) | (k == 0))


def test_arithmetic_precedence_and_floor_semantics():
    import numpy as np
    d = maskc.compile_mask("mask m()\n  allow (q - k) // 3 == -q % 4 - 2 ** 2 + 5\n").bind(13).dense()
    q, k = np.indices((13, 13))
    assert np.array_equal(d, (q - k) // 3 == (-q) % 4 - 4 + 5)


def test_mask_alias_form():
    import numpy as np
    d = maskc.compile_mask("mask m(w: int) = k <= q and q - k < w\n").bind(10, w=3).dense()
    q, k = np.indices((10, 10))
    assert np.array_equal(d, (k <= q) & (q - k < 3))


def test_parse_error_in_imported_file_names_that_file(tmp_path):
    (tmp_path / "other.mask").write_text("mask o()\n  allow k <=\n")
    (tmp_path / "main.mask").write_text('import "other.mask"\nmask m()\n  allow k <= q\n')
    with pytest.raises(MaskSyntaxError) as info:
        maskc.load(tmp_path / "main.mask")
    assert str(info.value).startswith(f"{tmp_path / 'other.mask'}:2:13:")


def test_missing_import_points_at_import_line(tmp_path):
    (tmp_path / "main.mask").write_text('\nimport "nope.mask"\nmask m()\n  allow k <= q\n')
    with pytest.raises(MaskSyntaxError) as info:
        maskc.load(tmp_path / "main.mask")
    assert info.value.span.line == 2 and info.value.span.col == 1
    assert "nope.mask" in info.value.message


def test_tab_indentation_caret_keeps_tabs():
    with pytest.raises(MaskSyntaxError) as info:
        maskc.compile_mask("mask m()\n\tallow k <= q $\n")
    caret = str(info.value).splitlines()[2]
    assert caret.startswith("  \t") and caret.endswith("^")
