"""A bound mask as FlexAttention's ``mask_mod`` (:class:`FlexMaskMod`) and ``score_mod`` (:class:`FlexScoreMod`):
callables in torch operations, the torch backend of the one interpreter (:mod:`maskc.analysis.interpret`).

The mask_mod reads only O(seq_len + kv_len) per-position tables (segment index/start/end and per-segment values,
one row per batch element) and the table parameters, so it works at any length, under torch.compile, and agrees
pair for pair with :func:`maskc.analysis.evaluate.dense_mask` (tests check it): both are the one interpreter, over
torch and over numpy. Its tables follow the positions it is called with to their device. :mod:`maskc.flex` gives
Flex's ``create_block_mask`` and ``create_mask`` for .mask files.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Union

import numpy as np

from maskc import ir
from maskc.analysis.evaluate import segment_tables
from maskc.analysis.interpret import Interpreter

if TYPE_CHECKING:
    import torch

    from maskc.bound import BoundMask

Device = Union[str, "torch.device", None]


def _concrete(device: "torch.device") -> "torch.device":
    """``device`` with its index: "cuda" is the current CUDA device (so that "cuda" and "cuda:0" compare equal)."""
    import torch

    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


class FlexMaskMod:
    """Callable ``(b, h, q_idx, kv_idx) -> bool tensor`` for ``flex_attention`` / ``create_block_mask``."""

    def __init__(self, bound: "BoundMask", device: Device = None):
        import torch

        device = _concrete(torch.device(device or "cpu"))
        self.bound = bound
        self.device = device
        self._copies: dict[torch.device, FlexMaskMod] = {device: self}
        self.mask = bound.mask.resolved
        self.batched = bound.batch > 1
        self.extent = max(bound.seq_len, bound.kv_len)
        params = bound.params
        as_tensor = lambda rows: torch.as_tensor(np.stack(rows), dtype=torch.int64, device=device)
        self.ints = {p.name: as_tensor([[e.int(p.name)] for e in params.batch])[:, 0]
                     for p in self.mask.params if p.kind == "int"}
        self.tables = {}
        self.lookups = {}             # table parameters: one row per batch element, padded to the longest
        for p in self.mask.params:
            if p.kind == "segments":
                per = [segment_tables(e.segment(p.name), self.extent) for e in params.batch]
                self.tables[p.name] = {key: as_tensor([t[key] for t in per]) for key in per[0]}
            elif p.kind == "table":
                rows = [e.table(p.name).values for e in params.batch]
                width = max(1, max(len(r) for r in rows))
                self.lookups[p.name] = as_tensor([np.pad(r, (0, width - len(r))) for r in rows])
        self.builtins = {"seq_len": bound.seq_len, "kv_len": bound.kv_len}

    def _row(self, b):
        return b if self.batched else 0

    def __repr__(self) -> str:
        return f"FlexMaskMod(mask {self.mask.name!r}, seq_len {self.builtins['seq_len']}, " \
               f"kv_len {self.builtins['kv_len']}, device {self.device})"

    def on(self, device: Device) -> "FlexMaskMod":
        """The same mask_mod with its tables on ``device`` (made once per device)."""
        import torch

        device = _concrete(torch.device(device or "cpu"))
        if device == self.device:
            return self
        if torch.compiler.is_compiling():    # traced (flex_attention under torch.compile): no cache mutation
            return FlexMaskMod(self.bound, device)
        if device not in self._copies:
            self._copies[device] = FlexMaskMod(self.bound, device)
        return self._copies[device]

    def __call__(self, b, h, q_idx, kv_idx):
        device = getattr(q_idx, "device", self.device)
        if _concrete(device) != self.device:   # a BlockMask moved with .to(device), or called on another GPU
            return self.on(device)(b, h, q_idx, kv_idx)
        return _TorchValues(self, b, h).visible(q_idx, kv_idx)


class FlexScoreMod:
    """Callable ``(score, b, h, q_idx, kv_idx) -> modified score`` for ``flex_attention``'s ``score_mod``: the mask's
    score modifier (:mod:`maskc.analysis.score`), elementwise in the score's dtype; its integer parts are
    computed as the mask_mod computes them (as integers), float tables are read at a clamped index."""

    def __init__(self, bound: "BoundMask", device: Device = None):
        import torch

        self.ints = FlexMaskMod(bound, device)
        self.device = self.ints.device
        score = bound.mask.resolved.score
        assert score is not None, "a mask without a score modifier has no score_mod"
        self.expr = score.expr
        params, device = bound.params, self.ints.device
        self.floats = {}
        for p in bound.mask.resolved.params:
            if p.kind == "float":
                self.floats[p.name] = torch.as_tensor([e.float(p.name) for e in params.batch], dtype=torch.float64,
                                                      device=device)
            elif p.kind == "float_table":       # one row per batch element, padded with its last entry
                rows = [e.float(p.name) for e in params.batch]
                width = max(len(r) for r in rows)
                self.floats[p.name] = torch.as_tensor(np.stack([np.pad(r, (0, width - len(r)), mode="edge")
                                                                for r in rows]), dtype=torch.float64, device=device)
        self.lengths = {p.name: torch.as_tensor([len(e.float(p.name)) for e in params.batch], device=device)
                        for p in bound.mask.resolved.params if p.kind == "float_table"}

    def __repr__(self) -> str:
        return f"FlexScoreMod(mask {self.ints.mask.name!r}, device {self.device})"

    def on(self, device: Device) -> "FlexScoreMod":
        """The same score_mod with its tables on ``device`` (made once per device)."""
        import torch

        device = _concrete(torch.device(device or "cpu"))
        if device == self.device:
            return self
        if torch.compiler.is_compiling():    # traced: no cache mutation
            return FlexScoreMod(self.ints.bound, device)
        copies = self.__dict__.setdefault("_copies", {})
        if device not in copies:
            copies[device] = FlexScoreMod(self.ints.bound, device)
        return copies[device]

    def __call__(self, score, b, h, q_idx, kv_idx):
        device = getattr(q_idx, "device", self.device)
        if _concrete(device) != self.device:   # called with positions on another device
            return self.on(device)(score, b, h, q_idx, kv_idx)
        return _TorchScores(self, b, h).score(self.expr, score, q_idx, kv_idx)


class _TorchValues(Interpreter):
    """The interpreter's primitives in torch operations, for one call of a mask_mod: batch element ``b`` and head
    ``h`` as Flex passes them (tensors, or ints), the tables of ``mask_mod`` on the positions' device. Integers
    are computed as Python computes them; bind proved every index in range and every divisor positive."""

    def __init__(self, mask_mod: FlexMaskMod, b, h):
        self.mask, self.data, self.b, self.h = mask_mod.mask, mask_mod, b, h
        self.row = mask_mod._row(b)

    def builtin(self, name: str):
        return {"h": self.h, "b": self.b}.get(name, self.data.builtins.get(name))

    def param(self, name: str):
        return self.data.ints[name][self.row]

    def segment(self, seg: str, attr: str, positions):
        return self.data.tables[seg][attr][self.row, positions]

    def table(self, e: ir.TableAt, indices: list, q, k):
        """Read at the row-major index."""
        flat = 0
        for index, stride in zip(indices, e.strides):
            flat = flat + index * self.int(stride, q, k)
        return self.data.lookups[e.table][self.row, flat]

    def minimum(self, a, b):
        import torch
        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))

    def maximum(self, a, b):
        import torch
        return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))

    def absolute(self, a):
        import torch
        return torch.abs(torch.as_tensor(a))

    def truth(self, value: bool, q, k):
        import torch
        return torch.full_like(q, value, dtype=torch.bool) if hasattr(q, "shape") else value


class _TorchScores(_TorchValues):
    """The same for one call of a score_mod: floats in the score's dtype, on its device."""

    def __init__(self, score_mod: FlexScoreMod, b, h):
        super().__init__(score_mod.ints, b, h)
        self.score_mod = score_mod

    def score_in(self, x):
        return x

    def float_const(self, value: float, x):
        return value

    def float_param(self, name: str, x):
        return self.score_mod.floats[name][self.row].to(x.dtype)

    def float_at(self, table: str, index, x):
        import torch
        index = torch.as_tensor(index, device=x.device)
        index = torch.clamp(index, min=torch.zeros_like(index), max=self.score_mod.lengths[table][self.row] - 1)
        return self.score_mod.floats[table][self.row, index].to(x.dtype)

    def to_float(self, value, x):
        import torch
        return torch.as_tensor(value, device=x.device).to(x.dtype)

    def fcall(self, fn: str, args: list):
        import torch
        if fn == "tanh":
            return torch.tanh(torch.as_tensor(args[0]))
        x, cap = args
        return cap * torch.tanh(x / cap)
