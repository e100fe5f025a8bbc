"""The errors of pass 1 (parse) in words a user reads: Lark's exceptions -> :class:`~maskc.errors.MaskSyntaxError`
at file:line:col, with what was found, what could stand there (grouped: "a value after '+'", "an operator", "a
type"), the bracket left open when one is, a hint for common slips, and "did you mean" for a misspelt keyword
(``alow k <= q``).
"""
from __future__ import annotations

import difflib
import re

from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from maskc.errors import MaskSyntaxError, Span

# What a user should read instead of Lark's terminal names.
_TOKEN_WORDS = {
    "NAME": "a name", "INT": "a number", "FLOAT": "a number", "STRING": "a quoted path", "_NL": "the end of the line",
    "_INDENT": "an indented line", "_DEDENT": "the end of the block", "$END": "the end of the file",
    "COMP_OP": "a comparison", "ADD_OP": "'+' or '-'", "MUL_OP": "'*', '//' or '%'", "OR_OP": "'|'",
    "XOR_OP": "'^'", "AND_OP": "'&'", "SHIFT_OP": "'<<' or '>>'", "TILDE": "'~'",
    "RULE_KIND": "'allow' or 'deny'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "DOT": "'.'", "MINUS": "'-'", "PLUS": "'+'",
}


def _describe(token_type: str, patterns: dict[str, str]) -> str:
    """A terminal in words: ``'int'`` for the keyword terminal ``_KW_INT``, ``a name`` for ``NAME``."""
    if token_type in _TOKEN_WORDS:
        return _TOKEN_WORDS[token_type]
    return f"'{patterns.get(token_type, token_type.lower())}'"


# Terminals that start a value, continue one after it, and start a parameter's type: an error lists each group as
# one phrase (Lark lists up to twenty terminals after a value).
_VALUE_STARTS = {"NAME", "INT", "FLOAT", "LPAR", "MINUS", "PLUS", "TILDE", "_KW_TRUE", "_KW_FALSE", "_KW_NOT"}
_OPERATORS = {"ADD_OP", "MUL_OP", "OR_OP", "XOR_OP", "AND_OP", "SHIFT_OP", "_KW_AND", "_KW_OR", "DOT", "LPAR", "LSQB"}
_BINARY = _OPERATORS - {"DOT", "LPAR", "LSQB"}
_COMPARISONS = {"COMP_OP", "_KW_IN", "_KW_NOT"}
_TYPES = {"_KW_INT", "_KW_CONST", "_KW_FLOAT", "_KW_SEGMENTS", "_KW_PER", "_KW_TABLE"}
_CLOSERS = {"(": ")", "[": "]"}
# The token just before an error, for "a value after '+'": operators of two characters first.
_LAST_TOKEN = re.compile(r"(\*\*|//|<<|>>|<=|>=|==|!=|[A-Za-z_]\w*|\d+(?:\.\d*)?|\S)[ \t]*$")


def _expected_words(terminals: set[str], patterns: dict[str, str], before: str | None) -> list[str]:
    """What the parser could take, in words: the groups above as one phrase each, then each other terminal;
    ``before``: the token before the error (for "a value after '+'")."""
    left = set(terminals)
    words = []
    if {"NAME", "INT"} <= left:
        after = f" after '{before}'" if before else ""
        words.append(f"a value{after} (a name, a number or '(')")
        left -= _VALUE_STARTS
    if left & _BINARY:             # after a value: any operator, comparison or postfix may follow (Lark may have
        words.append("an operator")  # reduced the value already, so that only its loosest operators are left)
        if left & {"COMP_OP", "_KW_IN"}:
            words.append("a comparison")
        left -= _OPERATORS | _COMPARISONS | {name for name, text in patterns.items() if text == "**"}
    if {"_KW_INT", "_KW_FLOAT", "_KW_SEGMENTS"} <= left:
        words.append("a type ('int', 'const int', 'float', 'segments', 'per', 'table')")
        left -= _TYPES
    return words + sorted({_describe(t, patterns) for t in left if not t.startswith("__") and t != "$END"})


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _open_brackets(lines: list[str], line: int, col: int) -> list[tuple[str, int, int]]:
    """The brackets opened and not closed before (line, col), innermost last, as (bracket, line, col); comments and
    quoted paths skipped."""
    stack: list[tuple[str, int, int]] = []
    for number, text in enumerate(lines[:line], 1):
        end = col - 1 if number == line else len(text)
        quoted = False
        for i, ch in enumerate(text[:end]):
            if ch == '"':
                quoted = not quoted
            elif quoted:
                continue
            elif ch == "#":
                break
            elif ch in _CLOSERS:
                stack.append((ch, number, i + 1))
            elif ch in _CLOSERS.values() and stack and _CLOSERS[stack[-1][0]] == ch:
                stack.pop()
    return stack


def _token_before(lines: list[str], line: int, col: int) -> str | None:
    """The token that ends just before (line, col), on that line (None at its start or after a comment)."""
    if not 0 < line <= len(lines):
        return None
    found = _LAST_TOKEN.search(lines[line - 1][: col - 1].split("#")[0])
    return found.group(1) if found else None


def _at_end_of_file(lines: list[str], line: int, col: int) -> bool:
    """Whether only blanks and comments follow (line, col)."""
    rest = [lines[line - 1][col - 1:]] + lines[line:] if 0 < line <= len(lines) else []
    return all(not text.split("#")[0].strip() for text in rest)


STATEMENT_KEYWORDS = ("allow", "deny", "require", "let")
"""The words a mask's body lines start with (besides ``score =``)."""


def _keywords(terminals, patterns: dict[str, str]) -> list[str]:
    """The keywords among the grammar's terminals ``terminals`` (names, as Lark's ``expected`` gives them);
    ``patterns``: the text of each of the grammar's literal terminals, by name."""
    words = {patterns.get(t, "") for t in terminals} | (set(STATEMENT_KEYWORDS[:2]) if "RULE_KIND" in terminals
                                                        else set())
    return sorted(w for w in words if w.isalpha())


def _misspelt_keyword(err: UnexpectedToken, accepts: set[str], lines: list[str],
                      patterns: dict[str, str]) -> tuple[str, int, int, str] | None:
    """(word, line, col, keyword) where the error comes from a misspelt keyword: the unexpected word itself
    close to a keyword the parser expected there (``msk``, ``itn``, ``adn``), or the word that starts a body
    line, which the parser took for ``NAME = ...``, close to a statement keyword (``alow k <= q``)."""
    tok = err.token
    if tok.type == "NAME":
        found = difflib.get_close_matches(str(tok), _keywords(accepts, patterns), n=1)
        if found:
            return str(tok), tok.line, tok.column, found[0]
    if "EQUAL" in accepts and tok.line and 0 < tok.line <= len(lines):
        first = re.match(r"([ \t]+)([A-Za-z_]\w*)[ \t]*", lines[tok.line - 1])
        if first and first.end() == tok.column - 1:
            found = difflib.get_close_matches(first.group(2), STATEMENT_KEYWORDS, n=1)
            if found:
                return first.group(2), tok.line, len(first.group(1)) + 1, found[0]
    return None


def _accepted(err: UnexpectedInput) -> set[str]:
    """The terminals the parser could take where ``err`` stopped it (Lark's ``expected`` when it cannot say)."""
    try:
        return set(err.interactive_parser.accepts())
    except Exception:                   # no parser state to ask (Lark raised before it had one)
        return set(getattr(err, "expected", None) or getattr(err, "allowed", None) or ())


def _terminal_of(text: str, patterns: dict[str, str]) -> str | None:
    """The name of the grammar's literal terminal ``text`` (``RSQB`` for ``]``)."""
    return next((name for name, value in patterns.items() if value == text), None)


def _unknown_statement(tok, accepts: set[str], lines: list[str]) -> tuple[str, int] | None:
    """(word, col) where a body line starts with a word that is no statement keyword and not ``score`` (the parser
    took it for ``NAME = ...`` and stopped at the token after it: ``permit k <= q``)."""
    if accepts != {"EQUAL"} or not tok.line or not 0 < tok.line <= len(lines):
        return None
    first = re.match(r"([ \t]+)([A-Za-z_]\w*)[ \t]*", lines[tok.line - 1])
    if first and first.end() == tok.column - 1 and first.group(2) != "score":
        return first.group(2), len(first.group(1)) + 1
    return None


# Operators of other languages a user may type for one of the language's (the text from the error's column, or
# from the column before it for a doubled one): what to write instead.
_SLIPS = (("=<", "did you mean '<='?"), ("=>", "did you mean '>='?"),
          ("&&", "conditions combine with 'and' ('&' is a bit operation on integers)"),
          ("||", "conditions combine with 'or' ('|' is a bit operation on integers)"),
          ("!", "a condition is negated with 'not' ('!' stands only in '!=')"))


# Characters that text copied from a paper, a web page or a word processor brings, each with what to type.
_LOOKALIKES = {
    "\u00a0": ("a no-break space", "a plain space"), "\u2009": ("a thin space", "a plain space"),
    "\u202f": ("a narrow no-break space", "a plain space"), "\u200b": ("a zero-width space", "nothing: delete it"),
    "\ufeff": ("a zero-width no-break space", "nothing: delete it"),
    "≤": ("'≤'", "'<='"), "≥": ("'≥'", "'>='"), "≠": ("'≠'", "'!='"), "−": ("a minus sign", "'-'"),
    "–": ("an en dash", "'-'"), "—": ("an em dash", "'-'"), "×": ("'×'", "'*'"), "÷": ("'÷'", "'//'"),
    "“": ("a curly quote", "'\"'"), "”": ("a curly quote", "'\"'"), "„": ("a curly quote", "'\"'"),
}


def _lookalike_hint(ch: str) -> str | None:
    """What to type for a character that looks like (or hides as) one the language takes."""
    if ch not in _LOOKALIKES:
        return None
    what, instead = _LOOKALIKES[ch]
    return f"this is {what} (U+{ord(ch):04X}), copied from formatted text most likely: type {instead}"


def _slip_hint(lines: list[str], line: int, col: int, accepts: set[str]) -> str | None:
    """A hint for an operator of another language at ``line:col`` (``=<``, ``&&``, ``!``), or for '=' where a
    comparison can stand."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    here, pair = text[col - 1:], text[max(col - 2, 0):]
    for slip, hint in _SLIPS:
        if here.startswith(slip) or (len(slip) == 2 and slip[0] == slip[1] and pair.startswith(slip)):
            return hint
    if here.startswith("=") and "COMP_OP" in accepts:
        return "compare with '=='"
    return None


def _indent_hint(lines: list[str], line: int, col: int) -> str:
    """Why the indented line ``line`` (its text from ``col``) is deeper than the parser expects: tabs among
    spaces (a tab counts as 8 columns, so lines that look aligned are not), else one indent too many."""
    indent = lines[line - 1][:col - 1]
    above = next((t for t in reversed(lines[:line - 1]) if t.strip() and not t.lstrip().startswith("#")), "")
    around = indent + above[:len(above) - len(above.lstrip(" \t"))]
    if " " in around and "\t" in around:
        return ("this line and the one above indent with tabs and spaces mixed: a tab counts as 8 columns, so "
                "they do not line up; indent with one or the other")
    return "a mask's rules are indented once, under its 'mask' line"


def span_at(path: str, lines: list[str], line: int, col: int, length: int = 1) -> Span:
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return Span(path, line, col, length, text)


def syntax_error(err: UnexpectedInput, path: str, lines: list[str], patterns: dict[str, str]) -> MaskSyntaxError:
    """The located, plain-words error for Lark's ``err`` in the text ``lines`` of ``path``; ``patterns``: the text
    of each of the grammar's literal terminals, by name (for "did you mean" on a misspelt keyword)."""
    line = getattr(err, "line", None) or len(lines) or 1
    col = getattr(err, "column", None) or 1
    if line == -1 or col == -1:          # at end of input: point just past the last character
        line = max(1, len(lines))
        col = len(lines[line - 1].rstrip("\n")) + 1 if lines else 1
    span = span_at(path, lines, line, col)
    if isinstance(err, UnexpectedCharacters):
        ch = lines[line - 1][col - 1] if line <= len(lines) and col <= len(lines[line - 1]) else "?"
        expected = _expected_words(_accepted(err), patterns, _token_before(lines, line, col))
        more = "; expected " + _join(expected) if expected and len(expected) <= 6 else ""
        hint = _slip_hint(lines, line, col, set()) or _lookalike_hint(ch)
        if ch == "\r":
            hint = "this file's lines end with '\\r' alone (old Mac line endings): save it with '\\n' or '\\r\\n'"
        return MaskSyntaxError(f"unexpected character {ch!r}{more}", span, hint)
    if isinstance(err, UnexpectedToken):
        # what the parser takes here; Lark's own `expected` also holds what its lexer tries everywhere (the end
        # of a line, even inside brackets, where lines are joined)
        accepts = _accepted(err)
        typo = _misspelt_keyword(err, accepts, lines, patterns)
        if typo is not None:
            word, line, col, keyword = typo
            return MaskSyntaxError(f"unknown keyword `{word}`; did you mean `{keyword}`?",
                                   span_at(path, lines, line, col, len(word)))
        tok = err.token
        statement = _unknown_statement(tok, accepts, lines)
        if statement is not None:
            word, col = statement
            return MaskSyntaxError(f"unknown keyword `{word}`; a line of a mask starts with allow, deny, require, "
                                   "let or `score =`", span_at(path, lines, tok.line, col, len(word)))
        ends = ("_NL", "_DEDENT", "$END")
        got = "the end of the file" if tok.type == "$END" or (
            tok.type == "_DEDENT" and _at_end_of_file(lines, line, col)) else (
            "an indented line" if tok.type == "_INDENT" else
            "the end of the line" if tok.type == "_NL" else
            "the end of the block" if tok.type == "_DEDENT" else repr(str(tok)))
        found = f"unexpected {got}" if got.startswith("'") else f"found {got}"
        hint = None
        length = max(1, len(str(tok)))
        if tok.type == "_INDENT":        # Lark places it at the end of the line before: point at the line
            line = min(line + 1, len(lines))
            col = len(lines[line - 1]) - len(lines[line - 1].lstrip(" \t")) + 1
            length = max(1, len(lines[line - 1][col - 1:].split(maxsplit=1)[0] if lines[line - 1].strip() else ""))
            hint = _indent_hint(lines, line, col)
        else:
            hint = _slip_hint(lines, line, col, accepts)
        span = span_at(path, lines, line, col, length)
        opened = _open_brackets(lines, line, col)
        if opened:
            bracket, open_line, open_col = opened[-1]
            closer = _CLOSERS[bracket]
            # lines join inside brackets: an end, or a token on a later line, is most likely a bracket left open
            if _terminal_of(closer, patterns) in accepts and (tok.type in ends or tok.line > open_line):
                return MaskSyntaxError(f"{found}; expected '{closer}' to close the '{bracket}' at "
                                       f"{open_line}:{open_col}", span, hint)
        expected = _expected_words(accepts, patterns, _token_before(lines, line, col))
        msg = found
        if expected and len(expected) <= 6:
            msg += "; expected " + _join(expected)
        return MaskSyntaxError(msg, span, hint)
    if isinstance(err, UnexpectedEOF):
        return MaskSyntaxError("unexpected end of the file", span)
    return MaskSyntaxError("cannot parse this", span)
