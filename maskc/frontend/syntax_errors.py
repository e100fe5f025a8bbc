"""The errors of pass 1 (parse) in words a user reads: Lark's exceptions -> :class:`~maskc.errors.MaskSyntaxError`
at file:line:col, with what was found, what could stand there, a hint for common slips, and "did you mean" for a
misspelt keyword (``alow k <= q``).
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


STATEMENT_KEYWORDS = ("allow", "deny", "require", "let")
"""The words a mask's body lines start with (besides ``score =``)."""


def _keywords(terminals, patterns: dict[str, str]) -> list[str]:
    """The keywords among the grammar's terminals ``terminals`` (names, as Lark's ``expected`` gives them);
    ``patterns``: the text of each of the grammar's literal terminals, by name."""
    words = {patterns.get(t, "") for t in terminals} | (set(STATEMENT_KEYWORDS[:2]) if "RULE_KIND" in terminals
                                                        else set())
    return sorted(w for w in words if w.isalpha())


def _misspelt_keyword(err: UnexpectedToken, lines: list[str],
                      patterns: dict[str, str]) -> tuple[str, int, int, str] | None:
    """(word, line, col, keyword) where the error comes from a misspelt keyword: the unexpected word itself
    close to a keyword the parser expected there (``msk``, ``itn``, ``adn``), or the word that starts a body
    line, which the parser took for ``NAME = ...``, close to a statement keyword (``alow k <= q``)."""
    tok = err.token
    if tok.type == "NAME":
        found = difflib.get_close_matches(str(tok), _keywords(err.expected, patterns), n=1)
        if found:
            return str(tok), tok.line, tok.column, found[0]
    if "EQUAL" in err.expected and tok.line and 0 < tok.line <= len(lines):
        first = re.match(r"([ \t]+)([A-Za-z_]\w*)[ \t]*", lines[tok.line - 1])
        if first and first.end() == tok.column - 1:
            found = difflib.get_close_matches(first.group(2), STATEMENT_KEYWORDS, n=1)
            if found:
                return first.group(2), tok.line, len(first.group(1)) + 1, found[0]
    return None


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
        return MaskSyntaxError(f"unexpected character {ch!r}", span)
    if isinstance(err, UnexpectedToken):
        typo = _misspelt_keyword(err, lines, patterns)
        if typo is not None:
            word, line, col, keyword = typo
            return MaskSyntaxError(f"unknown keyword `{word}`; did you mean `{keyword}`?",
                                   span_at(path, lines, line, col, len(word)))
        tok = err.token
        got = "the end of the file" if tok.type == "$END" else (
            "an indented line" if tok.type == "_INDENT" else
            "the end of the line" if tok.type == "_NL" else
            "the end of the block" if tok.type == "_DEDENT" else repr(str(tok)))
        expected = sorted({_describe(t, patterns) for t in err.expected if not t.startswith("__")})
        hint = None
        if tok.type == "_INDENT":        # Lark places it at the end of the line before: point at the line
            hint = "a mask's rules are indented once, under its 'mask' line"
            line = min(line + 1, len(lines))
            col = len(lines[line - 1]) - len(lines[line - 1].lstrip(" \t")) + 1
        elif str(tok) in ("=",) and "COMP_OP" in err.expected:
            hint = "compare with '=='"
        msg = f"unexpected {got}" if got.startswith("'") else f"found {got}"
        if expected and len(expected) <= 6:
            msg += "; expected " + " or ".join(expected)
        return MaskSyntaxError(msg, span_at(path, lines, line, col, max(1, len(str(tok)))), hint)
    if isinstance(err, UnexpectedEOF):
        return MaskSyntaxError("unexpected end of the file", span)
    return MaskSyntaxError("cannot parse this", span)
