"""Integer handles for live objects, so that a bound mask can cross an API that takes only numbers.

A torch custom op (``maskc.runtime.torch_ops``) accepts tensors and scalars, not a BoundMask; the mask travels as
its handle and is looked up again inside the op. Under ``torch.compile`` the handle travels as data, a 0-d
int64 array (:func:`as_array`, which torch.compile reads as a tensor input), not as an int: torch.compile
guards an int's value, so a new bound mask would cost a recompile, while a tensor's value is never
guarded. Handles are never reused, and the table holds its objects weakly: a handle outlives its object
only as a clear error. An autograd graph holds only the handle, so whatever runs a forward also calls
:func:`keep_alive`, which holds the most recently used objects strongly: a training step's mask survives
until its backward even if the caller drops it.
"""
from __future__ import annotations

import collections
import itertools
import weakref

import numpy as np

_live: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_counter = itertools.count(1)
_recent: collections.deque = collections.deque(maxlen=64)


def register(obj) -> int:
    """A new handle for ``obj`` (held weakly)."""
    handle = next(_counter)
    _live[handle] = obj
    return handle


def as_array(handle: int) -> np.ndarray:
    """The handle as a 0-d int64 array (writable, as torch wants the arrays it reads: leave it as it is)."""
    return np.array(handle, np.int64)


def lookup(handle: int):
    """The object registered under ``handle``; LookupError if it was never registered or is gone."""
    obj = _live.get(int(handle))
    if obj is None:
        raise LookupError(f"no live bound mask has handle {handle} (was it garbage-collected?)")
    return obj


def keep_alive(obj) -> None:
    """Hold ``obj`` strongly until 64 more objects have been kept alive after it."""
    if not any(x is obj for x in _recent):
        _recent.append(obj)
