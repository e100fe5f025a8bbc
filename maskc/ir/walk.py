"""Walks of resolved expressions and conditions (:mod:`maskc.ir.expr`) as DAGs: a let's value is shared by each
of its uses, so every walk here visits a shared sub-tree once and never recurses (resolve, bind, lint and the score
checks ask these questions)."""
from __future__ import annotations

from typing import Any

from maskc import ir


def is_int(node) -> bool:
    """Whether a resolved node is an integer expression (else a condition)."""
    return isinstance(node, (ir.Const, ir.Pos, ir.Builtin, ir.ParamRef, ir.SegAttr, ir.SegValue, ir.TableAt, ir.Arith,
                             ir.Func))


def children(node) -> tuple:
    """The operands of a resolved node (a table read's indices, not its strides)."""
    if isinstance(node, (ir.Arith, ir.Cmp)):
        return (node.left, node.right)
    if isinstance(node, ir.TableAt):
        return node.indices
    if isinstance(node, ir.Func):
        return node.args
    if isinstance(node, (ir.All, ir.Any_)):
        return node.items
    if isinstance(node, ir.Negate):
        return (node.item,)
    return ()


def nodes(node):
    """Every sub-node of a resolved expression, each once: resolved expressions are DAGs (a let's
    argument is shared by each of its uses), and a walk of the tree could take exponential time."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(children(n))


def mentions(node, predicate) -> bool:
    """Whether any sub-node of a resolved expression satisfies ``predicate``."""
    return any(predicate(n) for n in nodes(node))


def expanded_size(node) -> int:
    """The number of nodes of a resolved expression written out as a tree (what the passes after
    resolve walk), counted on its DAG in time linear in the DAG."""
    sizes: dict[int, int] = {}
    stack = [node]
    while stack:
        n = stack[-1]
        if id(n) in sizes:
            stack.pop()
            continue
        pending = [c for c in children(n) if id(c) not in sizes]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        sizes[id(n)] = 1 + sum(sizes[id(c)] for c in children(n))
    return sizes[id(node)]


def nesting(node) -> int:
    """The depth of a resolved expression or condition, counted without recursion (shared sub-trees
    once: a let used twice is one sub-tree)."""
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if id(n) in depth:
            continue
        kids = children(n)
        if expanded or not kids:
            depth[id(n)] = 1 + max((depth[id(c)] for c in kids), default=0)
        else:
            stack.append((n, True))
            stack.extend((c, False) for c in kids if id(c) not in depth)
    return depth[id(node)]


def depends_on_position(node) -> bool:
    """Whether a resolved expression reads q or k (directly, or through a segment attribute or array)."""
    return mentions(node, lambda n: isinstance(n, (ir.Pos, ir.SegAttr, ir.SegValue)))
