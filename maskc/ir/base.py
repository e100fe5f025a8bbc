"""What every IR node module shares: the span field that takes no part in equality, and the hash
computed once for the normal form's nested terms."""
from __future__ import annotations

from dataclasses import field

from maskc.errors import NO_SPAN, Span


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
