"""Pass 1, parse: .mask text → :class:`~maskc.ir.SourceFile` (a syntax tree with spans).

Invariant: the result mirrors the text exactly (no name is looked up, nothing is folded), and every
node carries the span of the text it came from. Any text that does not parse raises one
:class:`~maskc.errors.MaskSyntaxError` naming file:line:col, with a caret and a plain-words message.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import threading
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.indenter import Indenter
from lark.tree import Meta

from maskc import ir
from maskc.errors import MaskSyntaxError, Span
from maskc.frontend.sources import MAX_SOURCE_BYTES, read_source
from maskc.frontend.syntax_errors import span_at, syntax_error
from maskc.resources import grammar_text


class _MaskIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(grammar_text(), parser="lalr", postlex=_MaskIndenter(), propagate_positions=True,
                maybe_placeholders=True)


# Lark's Indenter keeps its paren and indent stacks on the instance, and one parser (so one indenter) is
# shared: two threads lexing at once corrupt each other's stacks. Parsing takes the lock; the tree is
# the caller's alone, so the transform after it runs unlocked.
_PARSE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _literal_terminals() -> dict[str, str]:
    """The text of each of the grammar's literal terminals (its keywords and punctuation), by name; a keyword is
    a regular expression ``word\\b`` in the grammar (it ends where a word ends), read here as its word."""
    out = {}
    for t in _parser().terminals:
        keyword = re.fullmatch(r"([a-z]+)\\b", t.pattern.value) if t.pattern.type == "re" else None
        if t.pattern.type == "str" or keyword:
            out[t.name] = keyword.group(1) if keyword else t.pattern.value
    return out


def _inconsistent_dedent(lines: list[str]) -> int:
    """The first line that dedents to a column no open block started at (1 if none is found)."""
    levels = [0]
    depth = 0
    for number, text in enumerate(lines, 1):
        stripped = text.strip()
        if not stripped or stripped.startswith("#") or depth > 0:
            depth += text.count("(") + text.count("[") - text.count(")") - text.count("]")
            continue
        indent = len(text.expandtabs(8)) - len(text.expandtabs(8).lstrip())
        if indent > levels[-1]:
            levels.append(indent)
        while indent < levels[-1]:
            levels.pop()
        if indent != levels[-1]:
            return number
        depth += text.count("(") + text.count("[") - text.count(")") - text.count("]")
    return 1


class _ToSyntax(Transformer_NonRecursive):
    """Lark tree → ir syntax nodes, each with the span Lark recorded for it."""

    def __init__(self, path: str, lines: list[str]):
        super().__init__()
        self.path, self.lines = path, lines

    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return span_at(self.path, self.lines, 1, 1)
        length = meta.end_pos - meta.start_pos if meta.line == meta.end_line else (
            len(self.lines[meta.line - 1]) - meta.column + 1)
        return span_at(self.path, self.lines, meta.line, meta.column, max(1, length))

    def _tok_span(self, tok: Token) -> Span:
        return span_at(self.path, self.lines, tok.line or 1, tok.column or 1, len(str(tok)))

    # -- file and declarations --------------------------------------------------------------
    def start(self, items):
        imports = tuple(i for i in items if isinstance(i, ir.ImportDecl))
        masks = tuple(i for i in items if isinstance(i, ir.MaskDecl))
        return ir.SourceFile(self.path, imports, masks)

    @v_args(meta=True)
    def import_stmt(self, meta, items):
        return ir.ImportDecl(str(items[0])[1:-1], self._span(meta))

    @v_args(meta=True)
    def mask_def(self, meta, items):
        name, *params, tail = items
        lets, rules, scores = tail
        params = tuple(p for p in params if p is not None)
        return ir.MaskDecl(str(name), params, lets, rules, self._tok_span(name), scores)

    @v_args(meta=True)
    def mask_alias(self, meta, items):
        cond = items[0]
        return (), (ir.RuleDecl("allow", (cond,), cond.span),), ()

    def mask_body(self, items):
        lets = tuple(i for i in items if isinstance(i, ir.LetDecl))
        rules = tuple(i for i in items if isinstance(i, ir.RuleDecl))
        scores = tuple(i for i in items if isinstance(i, ir.ScoreDecl))
        return lets, rules, scores

    @v_args(meta=True)
    def param(self, meta, items):
        name, ptype, default = items
        kind, origin, of, *extra = ptype if ptype is not None else ("int", None, None)
        over, sizes = extra if extra else ("q", None)
        return ir.ParamDecl(str(name), kind, default, origin, of, over, sizes, self._tok_span(name))

    def int_type(self, items):
        return ("int", None, None)

    def const_int_type(self, items):
        return ("const", None, None)

    def segments_type(self, items):
        over, origin = items
        return ("segments", origin, None, "q" if over is None else str(over), None)

    def per_type(self, items):
        return ("per", None, str(items[0]))

    def per_table_type(self, items):
        of, sizes = items
        return ("table", None, str(of), "q", sizes)

    def table_type(self, items):
        return ("table", None, None, "q", items[0])

    def table_sizes(self, items):
        return tuple(items)

    def float_type(self, items):
        return ("float", None, None)

    def float_per_type(self, items):
        return ("float_table", None, str(items[0]))

    def float_table_type(self, items):
        return ("float_table", None, None)

    @v_args(meta=True)
    def score_stmt(self, meta, items):
        target, value = items
        if str(target) != "score":
            raise MaskSyntaxError(f"'{target} = ...' assigns to '{target}'; only 'score' can be assigned",
                                  self._tok_span(target),
                                  f"a named value is 'let {target} = ...'; a score modifier is 'score = ...'")
        return ir.ScoreDecl(value, self._through(self._tok_span(target), value.span))

    @v_args(meta=True)
    def let_stmt(self, meta, items):
        name, *args, value = items
        args = tuple(str(a) for a in args if a is not None)
        return ir.LetDecl(str(name), args, value, self._tok_span(name))

    def _through(self, first: Span, last: Span) -> Span:
        """From the start of ``first`` to the end of ``last`` (on first's line), comments excluded."""
        end = last.col + last.length if last.line == first.line else len(first.source_line.rstrip("\n")) + 1
        return Span(first.file, first.line, first.col, max(1, end - first.col), first.source_line)

    @v_args(meta=True)
    def rule(self, meta, items):
        kind, *conds = items
        return ir.RuleDecl(str(kind), tuple(conds), self._through(self._tok_span(kind), conds[-1].span))

    @v_args(meta=True)
    def require_stmt(self, meta, items):
        start = span_at(self.path, self.lines, meta.line, meta.column, len("require"))
        return ir.RuleDecl("require", tuple(items), self._through(start, items[-1].span))

    # -- conditions -------------------------------------------------------------------------
    @v_args(meta=True)
    def or_(self, meta, items):
        return items[0] if len(items) == 1 else ir.BoolOp("or", tuple(items), self._span(meta))

    @v_args(meta=True)
    def and_(self, meta, items):
        return items[0] if len(items) == 1 else ir.BoolOp("and", tuple(items), self._span(meta))

    @v_args(meta=True)
    def not_(self, meta, items):
        return ir.Not(items[0], self._span(meta))

    @v_args(meta=True)
    def compare(self, meta, items):
        operands, ops = tuple(items[0::2]), tuple(str(t) for t in items[1::2])
        return ir.Compare(operands, ops, self._span(meta))

    def _range(self, meta, items, negated):
        value, (low, high, low_closed, high_closed) = items
        return ir.InRange(value, low, high, low_closed, high_closed, negated, self._span(meta))

    @v_args(meta=True)
    def in_range(self, meta, items):
        return self._range(meta, items, False)

    @v_args(meta=True)
    def not_in_range(self, meta, items):
        return self._range(meta, items, True)

    def closed_closed(self, items):
        return items[0], items[1], True, True

    def closed_open(self, items):
        return items[0], items[1], True, False

    def open_closed(self, items):
        return items[0], items[1], False, True

    def open_open(self, items):
        return items[0], items[1], False, False

    # -- expressions ------------------------------------------------------------------------
    @v_args(meta=True)
    def binop(self, meta, items):
        left, op, right = items
        return ir.BinOp(str(op), left, right, self._span(meta))

    @v_args(meta=True)
    def pow_(self, meta, items):
        return ir.BinOp("**", items[0], items[1], self._span(meta))

    @v_args(meta=True)
    def neg(self, meta, items):
        return ir.UnaryMinus(items[0], self._span(meta))

    @v_args(meta=True)
    def invert(self, meta, items):
        return ir.Invert(items[0], self._span(meta))

    @v_args(meta=True)
    def subscript(self, meta, items):
        return ir.Subscript(str(items[0]), tuple(items[1:]), self._span(meta))

    @v_args(meta=True)
    def number(self, meta, items):
        return ir.Num(int(items[0]), self._span(meta))

    @v_args(meta=True)
    def float_number(self, meta, items):
        return ir.FloatNum(float(items[0]), self._span(meta))

    @v_args(meta=True)
    def true_(self, meta, items):
        return ir.BoolLit(True, self._span(meta))

    @v_args(meta=True)
    def false_(self, meta, items):
        return ir.BoolLit(False, self._span(meta))

    @v_args(meta=True)
    def name(self, meta, items):
        return ir.Name(str(items[0]), self._tok_span(items[0]))

    @v_args(meta=True)
    def call(self, meta, items):
        func, *args = items
        return ir.Call(str(func), tuple(a for a in args if a is not None), self._span(meta))

    @v_args(meta=True)
    def method(self, meta, items):
        obj, method, *args = items
        return ir.MethodCall(str(obj), str(method), tuple(a for a in args if a is not None),
                             self._span(meta))

    @v_args(meta=True)
    def pos_arg(self, meta, items):
        return ir.Arg(None, items[0], self._span(meta))

    @v_args(meta=True)
    def kw_arg(self, meta, items):
        return ir.Arg(str(items[0]), items[1], self._span(meta))


# Levels of nesting (operators, comparisons, calls, not) one expression may have: every later pass
# recurses on expressions. Parentheses alone add none; a long flat sum adds log2 of its terms (SUM_AS_WRITTEN).
MAX_NESTING = 64
_NESTING = (ir.BinOp, ir.UnaryMinus, ir.Invert, ir.Subscript, ir.Call, ir.MethodCall, ir.Compare, ir.InRange, ir.BoolOp, ir.Not)


def _check_nesting(tree: ir.SourceFile, path: str) -> None:
    """No expression of the file nests more than MAX_NESTING levels (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, tuple):
            stack.extend((item, depth) for item in node)
            continue
        if not dataclasses.is_dataclass(node) or isinstance(node, Span):
            continue
        if isinstance(node, _NESTING):
            depth += 1
            if depth > MAX_NESTING:
                raise MaskSyntaxError(f"this expression nests more than {MAX_NESTING} levels deep", node.span,
                                      f"maskc takes at most {MAX_NESTING} levels of operators, comparisons and "
                                      "calls inside one another")
        stack.extend((getattr(node, f.name), depth) for f in dataclasses.fields(node))


# A chain of + and - (a + b - c + ...) of more terms than this is regrouped into a balanced tree before any pass
# sees it (:func:`_regroup_long_sums`), so a long flat sum nests log2(terms) deep and only true nesting meets
# MAX_NESTING. Up to this many terms a sum keeps its tree as written, left to right (what the passes and the
# generated code of every mask had before).
SUM_AS_WRITTEN = 16


def _is_sum(node) -> bool:
    return isinstance(node, Tree) and node.data == "binop" and getattr(node.children[1], "type", None) == "ADD_OP"


def _regroup_long_sums(tree: Tree) -> None:
    """Rebuild in place each chain of + and - longer than SUM_AS_WRITTEN terms (the left spine of Lark's binop
    trees) as a balanced tree of the same terms in the same order. Integers add exactly in any grouping; the
    floats of a score modifier round in the new one. Without recursion over the chain: it is as long as the file."""
    sums, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, Tree):
            if _is_sum(node):
                sums.append(node)
            stack.extend(node.children)
    on_spine = {id(t.children[0]) for t in sums if _is_sum(t.children[0])}
    heads = [t for t in sums if id(t) not in on_spine]
    for head in heads:
        terms, signs, node = [], [], head           # from the last term back to the first
        while _is_sum(node):
            terms.append(node.children[2])
            signs.append(str(node.children[1]) == "+")
            node = node.children[0]
        terms.append(node)
        signs.append(True)
        if len(terms) <= SUM_AS_WRITTEN:
            continue
        terms.reverse()
        signs.reverse()                             # signs[i]: whether terms[i] is added (True) or subtracted
        head.children = _balanced_sum(terms, signs, 0, len(terms)).children   # the head keeps its meta


_PLUS, _MINUS = Token("ADD_OP", "+"), Token("ADD_OP", "-")


def _balanced_sum(terms: list, signs: list[bool], lo: int, hi: int):
    """terms[lo:hi] added with their signs taken relative to terms[lo]'s, split in halves (depth log2(hi - lo))."""
    if hi - lo == 1:
        return terms[lo]
    mid = (lo + hi) // 2
    left = _balanced_sum(terms, signs, lo, mid)
    right = _balanced_sum(terms, signs, mid, hi)       # relative to terms[mid]'s sign: flipped as a whole
    op = _PLUS if signs[mid] == signs[lo] else _MINUS       # binop reads its text only: the meta places the node
    meta = Meta()
    first, last = getattr(terms[lo], "meta", terms[lo]), getattr(terms[hi - 1], "meta", terms[hi - 1])
    meta.empty = False
    meta.line, meta.column, meta.start_pos = first.line, first.column, first.start_pos
    meta.end_line, meta.end_column, meta.end_pos = last.end_line, last.end_column, last.end_pos
    return Tree("binop", [left, op, right], meta)


def source_lines(text: str) -> list[str]:
    """The lines as the grammar counts them, ends kept: split at '\\n' only (``str.splitlines`` also splits
    at form feeds, vertical tabs and other separators, and the caret would land on the wrong line)."""
    return [m.group() for m in re.finditer(r"[^\n]*\n|[^\n]+$", text)]


def parse(text: str, path: str = "<string>") -> ir.SourceFile:
    """Parse the text of one .mask file (a leading byte-order mark is skipped)."""
    if len(text) > MAX_SOURCE_BYTES:
        raise MaskSyntaxError(f"this text is {len(text)} characters long; maskc parses at most "
                              f"{MAX_SOURCE_BYTES} (1 MiB)", Span(path, 1, 1))
    text = text.removeprefix("\ufeff")
    if not text.endswith("\n"):
        text += "\n"
    lines = source_lines(text)
    try:
        with _PARSE_LOCK:
            tree = _parser().parse(text)
    except UnexpectedInput as err:
        raise syntax_error(err, path, lines, _literal_terminals()) from None
    except Exception:  # Lark's indenter raises a bare DedentError for inconsistent dedents.
        line = _inconsistent_dedent(lines)
        raise MaskSyntaxError("this line's indentation matches no enclosing block",
                              span_at(path, lines, line, 1), "indent rules one level under their 'mask' line"
                              ) from None
    _regroup_long_sums(tree)
    try:
        syntax = _ToSyntax(path, lines).transform(tree)      # not recursive: any depth is read
    except VisitError as err:
        raise err.orig_exc from None
    _check_nesting(syntax, path)
    return syntax


def parse_file(path: str | Path) -> ir.SourceFile:
    return parse(read_source(Path(path)), str(path))
