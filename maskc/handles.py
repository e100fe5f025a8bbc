"""Integer handles for live objects, so that a bound mask can cross an API that takes only numbers.

A torch custom op (``maskc.torch_ops``) accepts tensors and scalars, not a BoundMask; the mask travels as
its handle and is looked up again inside the op. Handles are never reused, and the table holds its
objects weakly: a handle outlives its object only as a clear error.
"""
from __future__ import annotations

import itertools
import weakref

_live: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_counter = itertools.count(1)


def register(obj) -> int:
    """A new handle for ``obj`` (held weakly)."""
    handle = next(_counter)
    _live[handle] = obj
    return handle


def lookup(handle: int):
    """The object registered under ``handle``; LookupError if it was never registered or is gone."""
    obj = _live.get(int(handle))
    if obj is None:
        raise LookupError(f"no live bound mask has handle {handle} (was it garbage-collected?)")
    return obj
