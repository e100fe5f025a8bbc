"""What every IR node module shares: the span field that takes no part in equality, the hash computed once for
the normal form's nested terms, and the memo that passes keep on a node (:func:`kept_on`)."""
from __future__ import annotations

from dataclasses import field
from typing import Callable, TypeVar

from maskc.errors import NO_SPAN, Span


T = TypeVar("T")


def span_field() -> Span:
    """A node's source span: kept for diagnostics, left out of equality and repr."""
    return field(default=NO_SPAN, compare=False, repr=False)


class HashOnce:
    """For the normal form's nested terms: hash once, then reuse (they key the evaluators' memos).

    A subclass repeats ``__hash__ = HashOnce.__hash__`` in its body: a frozen dataclass otherwise gets
    a generated __hash__ that rehashes the whole tree on every call. The cached hash is not pickled (string
    hashes differ between processes)."""

    def __hash__(self):
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((type(self).__name__,) + tuple(getattr(self, f) for f in self.__dataclass_fields__
                                                         if self.__dataclass_fields__[f].compare))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def kept_on(node: object, name: str, compute: Callable[[], T], along: object = None) -> T:
    """``compute()``, worked out on the first call for ``node`` (and ``along``, by identity: a second object the
    value depends on) and kept on the node under ``name``; the kept value while ``along`` is the same object.

    For pure functions of immutable IR nodes that passes ask again at every bind (a RangeMask's piece plan, a
    condition's program). The value lives in the instance's ``__dict__``, outside its dataclass fields: equality,
    hashing and repr never see it, and a node made by ``dataclasses.replace`` starts without it."""
    kept = node.__dict__.get(name)
    if kept is None or kept[0] is not along:
        kept = (along, compute())
        object.__setattr__(node, name, kept)
    return kept[1]
