"""What a linear form (:class:`~maskc.ir.Lin`) reads, and how it prints: the questions the passes ask of
forms and terms (does it read k, a chunk index, the head; which forms a term holds; k's coefficient), and
the readable rendering explain and diagnostics show. Building forms and their algebra: :mod:`maskc.analysis.linear`.
"""
from __future__ import annotations

import functools

from maskc import ir
from maskc.ir.text import leaf_text


def inner_lins(term) -> tuple[ir.Lin, ...]:
    if isinstance(term, ir.Root):
        return (term.arg,)
    if isinstance(term, ir.Square):
        return (term.base,)
    if isinstance(term, ir.Product):
        return (term.left, term.right)
    if isinstance(term, ir.Floor):
        return (term.num, term.den)
    if isinstance(term, ir.Extreme):
        return term.args
    if isinstance(term, ir.Bits):
        return (term.left, term.right)
    if isinstance(term, (ir.Lookup, ir.SegBound)):
        return (term.index,)
    return ()


def term_mentions(term, leaf_test) -> bool:
    if leaf_test(term):
        return True
    return any(lin_mentions(lin, leaf_test) for lin in inner_lins(term))


def lin_mentions(lin: ir.Lin, leaf_test) -> bool:
    return any(term_mentions(t, leaf_test) for t, _ in lin.terms)


def _is_k_leaf(t) -> bool:
    return (isinstance(t, ir.Pos) and t.which == "k") or (
        isinstance(t, (ir.SegAttr, ir.SegValue)) and t.pos == "k")


def depends_on_k(lin: ir.Lin) -> bool:
    return lin_mentions(lin, _is_k_leaf)


def term_depends_on_k(term) -> bool:
    return term_mentions(term, _is_k_leaf)


@functools.lru_cache(maxsize=4096)
def term_reads_chunks(term) -> bool:
    """Whether a term reads a chunk index (:class:`~maskc.ir.ChunkVar`)."""
    return term_mentions(term, lambda t: isinstance(t, ir.ChunkVar))


def reads_chunks(lin: ir.Lin) -> bool:
    return any(term_reads_chunks(t) for t, _ in lin.terms)


def shift_amounts(lins):
    """The amount of every shift that stayed whole (a ``<<`` or ``>>`` :class:`~maskc.ir.Bits`) in the forms."""
    for lin in lins:
        for t in terms_of(lin):
            if isinstance(t, ir.Bits) and t.op in ("<<", ">>"):
                yield t.right


def _is_q_leaf(t) -> bool:
    return (isinstance(t, ir.Pos) and t.which == "q") or (isinstance(t, (ir.SegAttr, ir.SegValue)) and t.pos == "q")


def depends_on_q(lin: ir.Lin) -> bool:
    return lin_mentions(lin, _is_q_leaf)


def term_depends_on_q(term) -> bool:
    return term_mentions(term, _is_q_leaf)


def depends_on_head(lin: ir.Lin) -> bool:
    return lin_mentions(lin, lambda t: isinstance(t, ir.Builtin) and t.name == "h")


K = ir.Pos("k")
Q = ir.Pos("q")


def split_k(lin: ir.Lin) -> tuple[int, ir.Lin] | None:
    """``lin = a*k + rest`` with ``rest`` free of k, as ``(a, rest)``; None if k appears otherwise."""
    return split_on(lin, K)


def reads(lin: ir.Lin, var) -> bool:
    """Whether ``lin`` reads the variable ``var``: k (with the segment attributes at k) or a ChunkVar."""
    if var == K:
        return depends_on_k(lin)
    return lin_mentions(lin, lambda t: t == var)


def split_on(lin: ir.Lin, var) -> tuple[int, ir.Lin] | None:
    """``lin = a*var + rest`` with ``rest`` free of ``var``, as ``(a, rest)``; None if ``var`` appears otherwise."""
    a = lin.coef(var)
    rest = ir.Lin(tuple((t, c) for t, c in lin.terms if t != var), lin.const)
    if reads(rest, var):
        return None
    return a, rest


def terms_of(lin: ir.Lin):
    """Every term at any depth, outermost first."""
    for t, _ in lin.terms:
        yield t
        for inner in inner_lins(t):
            yield from terms_of(inner)


def render(lin: ir.Lin) -> str:
    """A readable form, for explain and diagnostics."""
    parts = []
    for t, c in lin.terms:
        name = render_term(t)
        # .mask precedence: a bit operation binds looser than + and -, a floor as tightly as * (and looser
        # than a unary minus), so either is parenthesized where a sign, a factor or a neighbour would bind it
        if isinstance(t, ir.Bits) or (isinstance(t, ir.Floor) and c != 1):
            name = f"({name})"
        if c == 1:
            parts.append(f"+ {name}")
        elif c == -1:
            parts.append(f"- {name}")
        else:
            parts.append(f"{'+' if c > 0 else '-'} {abs(c)}*{name}")
    if lin.const or not parts:
        parts.append(f"{'+' if lin.const >= 0 else '-'} {abs(lin.const)}")
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def render_term(t) -> str:
    leaf = leaf_text(t)
    if leaf is not None:
        return leaf
    if isinstance(t, ir.Square):
        return f"({render(t.base)})**2"
    if isinstance(t, ir.Product):
        return f"({render(t.left)})*({render(t.right)})"
    if isinstance(t, ir.Floor):
        return f"({render(t.num)}) {t.op} ({render(t.den)})"
    if isinstance(t, ir.Extreme):
        return f"{t.fn}({', '.join(render(a) for a in t.args)})"
    if isinstance(t, ir.ChunkVar):
        return f"J{t.level}"
    if isinstance(t, ir.Root):
        return f"isqrt({render(t.arg)})"
    if isinstance(t, ir.Bits):
        return f"({render(t.left)}) {t.op} ({render(t.right)})"
    if isinstance(t, ir.Lookup):
        return f"{t.table}[{render(t.index)}]"
    if isinstance(t, ir.SegBound):
        return f"{t.seg}.bound({render(t.index)})"
    return repr(t)
