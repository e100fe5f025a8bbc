"""A bound mask as a FlexAttention ``mask_mod``: the resolved rules written in torch operations.

The mask_mod reads only O(seq_len + kv_len) per-position tables (segment index/start/end and
per-segment values, one row per batch element), so it works at any length, under torch.compile,
and agrees pair for pair with :func:`maskc.evaluate.dense_mask` (tests check it).
"""
from __future__ import annotations

import numpy as np

from . import ir
from .evaluate import segment_tables


class FlexMaskMod:
    """Callable ``(b, h, q_idx, kv_idx) -> bool tensor`` for ``flex_attention`` / ``create_block_mask``."""

    def __init__(self, bound, device="cuda"):
        import torch

        self.mask = bound.mask.resolved
        self.batched = bound.batch > 1
        self.extent = max(bound.seq_len, bound.kv_len)
        params = bound.params
        as_tensor = lambda rows: torch.as_tensor(np.stack(rows), dtype=torch.int64, device=device)
        self.ints = {p.name: as_tensor([[e.int(p.name)] for e in params.batch])[:, 0]
                     for p in self.mask.params if p.kind == "int"}
        self.tables = {}
        for p in self.mask.params:
            if p.kind == "segments":
                per = [segment_tables(e.segment(p.name), self.extent) for e in params.batch]
                self.tables[p.name] = {key: as_tensor([t[key] for t in per]) for key in per[0]}
        self.builtins = {"seq_len": bound.seq_len, "kv_len": bound.kv_len}

    def _row(self, b):
        return b if self.batched else 0

    def int(self, e, b, h, q, k):
        if isinstance(e, ir.Const):
            return e.value
        if isinstance(e, ir.Pos):
            return q if e.which == "q" else k
        if isinstance(e, ir.Builtin):
            return {"h": h, "b": b}.get(e.name, self.builtins.get(e.name))
        if isinstance(e, ir.ParamRef):
            return self.ints[e.name][self._row(b)]
        if isinstance(e, (ir.SegAttr, ir.SegValue)):
            key = e.attr if isinstance(e, ir.SegAttr) else "value:" + e.array
            return self.tables[e.seg][key][self._row(b), q if e.pos == "q" else k]
        if isinstance(e, ir.Func):
            import torch
            args = [torch.as_tensor(self.int(a, b, h, q, k)) for a in e.args]
            if e.fn == "abs":
                return torch.abs(args[0])
            out = args[0]
            for a in args[1:]:
                out = torch.minimum(out, a) if e.fn == "min" else torch.maximum(out, a)
            return out
        left, right = self.int(e.left, b, h, q, k), self.int(e.right, b, h, q, k)
        return {"+": lambda: left + right, "-": lambda: left - right, "*": lambda: left * right,
                "//": lambda: left // right, "%": lambda: left % right}[e.op]()

    def cond(self, c, b, h, q, k):
        import torch
        if isinstance(c, ir.Truth):
            return torch.full_like(q, c.value, dtype=torch.bool) if hasattr(q, "shape") else c.value
        if isinstance(c, ir.Cmp):
            left, right = self.int(c.left, b, h, q, k), self.int(c.right, b, h, q, k)
            return _compare(c.op, left, right)
        if isinstance(c, ir.Same):
            index = self.tables[c.seg]["index"][self._row(b)]
            iq, ik = index[q], index[k]
            return (iq >= 0) & (iq == ik)
        if isinstance(c, ir.Negate):
            return ~self.cond(c.item, b, h, q, k)
        parts = [self.cond(i, b, h, q, k) for i in c.items]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(c, ir.All) else (out | p)
        return out

    def __call__(self, b, h, q_idx, kv_idx):
        allow = deny = None
        for r in self.mask.rules:
            if r.kind == "require":
                continue
            v = self.cond(r.cond, b, h, q_idx, kv_idx)
            if r.kind == "allow":
                allow = v if allow is None else allow | v
            else:
                deny = v if deny is None else deny | v
        return allow if deny is None else allow & ~deny


def _compare(op, left, right):
    if op == "<":
        return left < right
    if op == "<=":
        return left <= right
    if op == ">":
        return left > right
    if op == ">=":
        return left >= right
    if op == "==":
        return left == right
    return left != right
