"""Bit operations (``&``, ``|``, ``^``, ``<<``, ``>>``) on int64 values: exact, and as interval bounds.

The meaning is Python's on integers of any sign: ``&``, ``|`` and ``^`` act on two's complement (infinitely
sign-extended), ``x >> n == x // 2**n`` (it floors), ``x << n == x * 2**n``, for shift amounts ``n`` from 0 to
:data:`~maskc.ir.MAX_SHIFT`. Every value maskc computes lies within 2**62 (:mod:`maskc.analysis.widths`), so int64 two's
complement gives Python's results: the dense reference, classification and the kernels agree.

:func:`interval` bounds ``a op b`` given bounds on ``a`` and ``b`` (numpy arrays or scalars, broadcast):
the true value of every pair of operands in their bounds lies inside; exact when both operands are known
(lower == upper). The bits above the highest bit in which an operand's bounds differ are the same for every
value between them, so over a tile where only an operand's low bits vary (Morton codes over aligned tiles)
the result's high bits are known too.
"""
from __future__ import annotations

import numpy as np

from maskc.ir import MAX_SHIFT

_EXACT = {"&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor,
          "<<": np.left_shift, ">>": np.right_shift}


def apply(op: str, a, b):
    """``a op b`` elementwise on int64 values (shift amounts in [0, MAX_SHIFT], checked at bind)."""
    return _EXACT[op](np.asarray(a, np.int64), np.asarray(b, np.int64))


def bit_length(v):
    """Python's ``int.bit_length`` of each non-negative int64 value."""
    x = np.asarray(v, np.int64)
    n = np.zeros_like(x)
    for s in (32, 16, 8, 4, 2, 1):
        big = x >= (np.int64(1) << s)
        x = np.where(big, x >> s, x)
        n = n + np.where(big, s, 0)
    return n + (x > 0)


def _span(a0, a1, b0, b1):
    """(-2**n, 2**n - 1) for the least n with both operands' bounds inside: ``&``, ``|`` and ``^`` of two
    values in that range stay in it (two's complement on n + 1 bits)."""
    n = bit_length(np.maximum.reduce(np.broadcast_arrays(a1, b1, ~np.asarray(a0), ~np.asarray(b0), 0)))
    top = np.where(n > 0, ((np.int64(1) << np.maximum(n - 1, 0)) - 1) * 2 + 1, 0)    # 2**n - 1, n <= 63
    return -top - 1, top


def _common_bits(lo, hi):
    """d per interval: every value in [lo, hi] has the bits of ``lo`` above the lowest d (63 where lo and hi
    differ in sign: no bit is known)."""
    x = lo ^ hi
    return np.where(x >= 0, bit_length(np.maximum(x, 0)), 63)


def _known_high_bits(op: str, a0, a1, b0, b1):
    """(lo, hi) from the operands' common high bits, and where that is defined (their low bits below 2**61)."""
    d = np.maximum(_common_bits(a0, a1), _common_bits(b0, b1))
    usable = d <= 61
    low = (np.int64(1) << np.minimum(d, 61)) - 1
    high = _EXACT[op](a0 & ~low, b0 & ~low)           # the result's bits above the lowest d, exactly
    a_known, b_known = a0 == a1, b0 == b1              # a known operand's low bits are known too
    a_max, b_max = np.where(a_known, a0 & low, low), np.where(b_known, b0 & low, low)
    a_min, b_min = np.where(a_known, a0 & low, 0), np.where(b_known, b0 & low, 0)
    part: tuple
    if op == "&":
        part = (0, np.minimum(a_max, b_max))
    elif op == "|":
        part = (np.maximum(a_min, b_min), low)
    else:
        part = (0, low)
    return high + part[0], high + part[1], usable


def _shift_bounds(op: str, a, s):
    """``a << s`` or ``a >> s``: monotone in a, and in s for a fixed a, so the corners bound it."""
    s0, s1 = (np.clip(x, 0, MAX_SHIFT) for x in s)
    corners = [_EXACT[op](x, y) for x in a for y in (s0, s1)]
    return (np.minimum.reduce(np.broadcast_arrays(*corners)), np.maximum.reduce(np.broadcast_arrays(*corners)))


def interval(op: str, a: tuple, b: tuple) -> tuple:
    """Bounds (lo, hi) of ``a op b`` over operands within ``a = (a0, a1)`` and ``b = (b0, b1)`` (int64)."""
    a0, a1 = (np.asarray(x, np.int64) for x in a)
    b0, b1 = (np.asarray(x, np.int64) for x in b)
    if op in ("<<", ">>"):
        lo, hi = _shift_bounds(op, (a0, a1), (b0, b1))
    else:
        low, top = _span(a0, a1, b0, b1)
        both = (a0 >= 0) & (b0 >= 0)
        if op == "&":           # the result's bits are a subset of each operand's: below either if it is >= 0
            lo = np.where((a0 >= 0) | (b0 >= 0), 0, low)
            hi = np.where(both, np.minimum(a1, b1), np.where(a0 >= 0, a1, np.where(b0 >= 0, b1, np.maximum(a1, b1))))
        elif op == "|":         # setting bits: at least either operand when both are >= 0, or both < 0
            negative = (a1 < 0) & (b1 < 0)
            lo = np.where(both | negative, np.maximum(a0, b0), low)
            hi = np.where(both, np.minimum(top, a1 + b1), np.where(negative, -1, top))
        else:                   # a ^ b <= a | b <= a + b for a, b >= 0
            lo = np.where(both, 0, low)
            hi = np.where(both, np.minimum(top, a1 + b1), top)
        high_lo, high_hi, usable = _known_high_bits(op, a0, a1, b0, b1)
        lo, hi = np.where(usable, np.maximum(lo, high_lo), lo), np.where(usable, np.minimum(hi, high_hi), hi)
    known = (a0 == a1) & (b0 == b1)
    if np.any(known):
        exact = apply(op, a0, np.clip(b0, 0, MAX_SHIFT) if op in ("<<", ">>") else b0)
        lo, hi = np.where(known, exact, lo), np.where(known, exact, hi)
    return lo, hi
