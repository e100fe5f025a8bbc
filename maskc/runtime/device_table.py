"""A device-bound mask's parameter table: :func:`maskc.codegen.predicate.pack_mask_data`'s layout in a preallocated
torch int32 buffer ``[B, width]``, of one size whatever the values (every segments parameter holds its capacity of
segments, the unused ones of length 0; tables keep the lengths they were bound with). New values are copied into an
int64 stage of the same layout (segments as lengths), which the builder's generated ``validate`` kernel narrows
into the table, turning lengths into bounds and checking everything (segments, `require` rules, 32-bit ranges) in
the same launch (:meth:`maskc.DeviceMask.update`); on the CPU :meth:`DeviceTable.apply` does it in torch. Read back
for the host's oracle (:meth:`DeviceTable.host_values`).

Segments of length 0 change no visible pair, so a table padded with them is the mask of the lengths given: the
host's descriptor of the padded lengths is the device's, array for array.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from maskc import ir
from maskc.analysis.values import INT32, INT32_MIN
from maskc.codegen.cwriter import TableLayout
from maskc.codegen.predicate import pack_mask_data
from maskc.errors import BindError
from maskc.runtime.device_eval import TableInts, as_tensor_on

if TYPE_CHECKING:
    import torch

    from maskc.bound import BoundMask

RANGE_BIT = 30                  # status[2]: a value given as a tensor does not fit in 32 bits
MAX_REQUIRE_BITS = 30           # status[2] bits 0..29: `require` rule i failed


def pad_segments(mask, values: dict, capacity: dict[str, int]) -> dict:
    """``values`` (as bind takes them) with every segments parameter's lengths, and its per-segment arrays,
    padded with zeros to its capacity (a BindError where they already have more)."""
    from maskc.analysis.values import is_batched

    out = dict(values)
    for p in mask.params:
        if p.kind not in ("segments", "per") or p.name not in values:
            continue
        seg = p.name if p.kind == "segments" else p.of
        cap, v = capacity[seg], values[p.name]
        rows = [list(e) for e in v] if is_batched(p, v) else None

        def padded(row, where=""):
            row = [int(x) for x in (row.tolist() if isinstance(row, np.ndarray) else row)]
            if len(row) > cap:
                raise BindError(f"'{p.name}'{where} has {len(row)} entries, more than max_segments = {cap} of "
                                f"'{seg}'", p.span, "raise max_segments (bind_on_device(..., max_segments=N))")
            return row + [0] * (cap - len(row))
        out[p.name] = ([padded(r, f" (batch element {b})") for b, r in enumerate(rows)] if rows is not None
                       else padded(v))
    return out


def capacities(mask, values: dict, max_segments) -> dict[str, int]:
    """Each segments parameter's capacity: ``max_segments`` (one int for all, or a dict by name), else the most
    segments the initial values give it."""
    from maskc.analysis.values import is_batched

    out = {}
    for p in mask.params:
        if p.kind != "segments":
            continue
        given = max_segments.get(p.name) if isinstance(max_segments, dict) else max_segments
        v = values.get(p.name)
        if v is None and given is None:
            continue                                # bind says it is missing
        initial = 0 if v is None else (max(len(e) for e in v) if is_batched(p, v) else len(v))
        cap = initial if given is None else given
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
            raise BindError(f"max_segments of '{p.name}' must be a positive integer, got {cap!r}", p.span)
        out[p.name] = int(cap)
    if isinstance(max_segments, dict):
        stray = [n for n in max_segments if n not in out]
        if stray:
            raise BindError(f"max_segments names {', '.join(map(repr, stray))}, not a segments parameter of mask "
                            f"'{mask.name}'", mask.span)
    return out


class DeviceTable:
    """The table of a device-bound mask (see the module docstring). ``host`` is the initial binding, of padded
    values; ``capacity`` the segments each segments parameter holds."""

    def __init__(self, ranges: ir.RangeMask, resolved: ir.ResolvedMask, host: "BoundMask",
                 capacity: dict[str, int], device: "torch.device"):
        import torch

        self.ranges, self.resolved, self.capacity = ranges, resolved, capacity
        self.layout = TableLayout.of(ranges.params)
        self.seq_len, self.kv_len, self.num_heads = host.seq_len, host.kv_len, host.num_heads
        self.batch = host.batch
        data, offsets = pack_mask_data(ranges, host.params)
        widths = set(np.diff(offsets).tolist())
        if len(widths) != 1:
            raise BindError(f"mask '{resolved.name}': its tables differ in length across the batch; a mask bound on "
                            "the device keeps one table size: give every batch element tables of one length",
                            resolved.span)
        self.width = widths.pop()
        header = data[:self.width]
        self.segment_at = {s: int(header[self.layout.seg_slot(s)]) for s in self.layout.segments}
        self.table_at = {t: int(header[self.layout.table_slot(t)]) for t in self.layout.tables}
        self.float_at = {f: int(header[self.layout.float_slot(f)]) for f, is_table in self.layout.floats if is_table}
        self.shapes = {n: t.shape for n, t in host.params.batch[0].tables}
        self.float_counts = {n: int(np.size(v)) for n, v in host.params.batch[0].floats}
        self.data = torch.tensor(data, dtype=torch.int32, device=device).view(self.batch, self.width)
        self.offsets = torch.tensor(offsets, dtype=torch.int32, device=device)
        self.device = self.data.device
        self.stage = torch.tensor(self._staged(data.reshape(self.batch, self.width)), dtype=torch.int64,
                                  device=device)

    def _staged(self, table: np.ndarray) -> np.ndarray:
        """The stage of a table (int64 [B, width]): the table with each segments table's bounds 1 .. n replaced
        by its lengths (what :meth:`write` writes and the validate kernel reads)."""
        out = table.astype(np.int64)
        for s in self.layout.segments:
            at, cap = self.segment_at[s], self.capacity[s]
            out[:, at + 2:at + 2 + cap] = np.diff(out[:, at + 1:at + 2 + cap], axis=1)
        return out

    # -- writing ------------------------------------------------------------------------------------
    def write(self, values: dict) -> None:
        """Write new values (see :meth:`maskc.DeviceMask.update`) into the stage, int64 in the table's layout
        (segments as lengths): one copy per value (its dtype converted by the copy), a fill for the unused
        segments of a segments parameter given fewer. The table follows when the stage is applied: by the
        builder's ``validate`` kernel on the GPU (which also checks everything), by :meth:`apply` on the CPU."""
        import torch

        params = {p.name: p for p in self.resolved.params}
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        for name, value in values.items():
            p = params.get(name)
            if p is None:
                from maskc.errors import did_you_mean
                raise BindError(f"mask '{self.resolved.name}' has no parameter '{name}'", self.resolved.span,
                                did_you_mean(name, list(params)))
            if p.const:
                raise BindError(f"parameter '{name}' is const: its value is compiled into the kernels and cannot "
                                "change on the device", p.span, "bind a new mask on the device for another value")
            if capturing and not isinstance(value, torch.Tensor):
                raise BindError(f"parameter '{name}': inside a CUDA graph capture, give new values as tensors on "
                                f"the GPU (a host value would be baked into the graph), not {type(value).__name__}",
                                p.span)
            if p.kind == "int":
                self.stage[:, self.layout.int_slot(name)].copy_(self._rows(value, p, ()))
            elif p.kind in ("segments", "per"):
                seg = name if p.kind == "segments" else _segments_of(p)
                v = self._rows(value, p, (None,))
                at = self.segment_at[seg] + 2 + (0 if p.kind == "segments" else
                                                 self.capacity[seg] * (1 + self.layout.array_slot(name)))
                n, cap = self._count(v, p, seg), self.capacity[seg]
                self.stage[:, at:at + n].copy_(v)
                if n < cap:
                    self.stage[:, at + n:at + cap].fill_(0)
            elif p.kind == "table":
                count = int(np.prod(self.shapes[name]))
                at = self.table_at[name] + 1
                self.stage[:, at:at + count].copy_(self._rows(value, p, self.shapes[name]).reshape(self.batch, count))
            else:                                   # float, float table: their bits
                count = self.float_counts[name]
                v = self._rows(value, p, () if p.kind == "float" else (count,), torch.float32)
                bits = v.to(torch.float32).reshape(self.batch, -1).contiguous().view(torch.int32)
                at = self.layout.float_slot(name) if p.kind == "float" else self.float_at[name] + 1
                self.stage[:, at:at + count].copy_(bits)

    def apply(self) -> None:
        """The stage into the table, in torch (the CPU's path; on the GPU the ``validate`` kernel does this and
        checks the values): every value clamped into int32, each segments table's bounds its origin then the
        running sums of its lengths."""
        import torch

        self.data.copy_(self.stage.clamp(INT32_MIN, INT32).to(torch.int32))
        for s in self.layout.segments:
            at, cap = self.segment_at[s], self.capacity[s]
            origin = self._origin(self.ranges.param(s))
            ends = torch.cumsum(self.stage[:, at + 2:at + 2 + cap], dim=1) + origin[:, None]
            bounds = torch.cat([origin[:, None], ends], dim=1).clamp_(INT32_MIN, INT32)
            self.data[:, at + 1:at + 2 + cap].copy_(bounds.to(torch.int32))

    def _rows(self, value, p: ir.Param, shape: tuple, dtype=None) -> "torch.Tensor":
        """``value`` as a tensor [B, *shape] on the table's device (int64, or ``dtype``): one value for the whole
        batch, or one per batch element (a leading dimension B). ``None`` in ``shape``: any length."""
        import torch

        if isinstance(value, torch.Tensor):        # converted by the stage's copy (floats: cast before their bits)
            v = value if value.device == self.device else value.to(self.device, non_blocking=True)
            if dtype is None and (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool):
                raise BindError(f"parameter '{p.name}' must be integers, got a tensor of {v.dtype}", p.span)
        else:
            dtype = dtype or torch.int64
            if shape == (None,) and isinstance(value, (list, tuple)) and value and all(
                    isinstance(e, (list, tuple, np.ndarray)) for e in value):     # ragged rows: empty segments after
                width = max(len(e) for e in value)
                value = [list(e) + [0] * (width - len(e)) for e in value]
            if p.kind != "float" and p.kind != "float_table":
                flat = np.asarray(value, dtype=object).reshape(-1)
                if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in flat):
                    raise BindError(f"parameter '{p.name}' must be integers, got {value!r}", p.span)
                if any(not INT32_MIN <= int(x) <= INT32 for x in flat):
                    raise BindError(f"parameter '{p.name}' has a value that does not fit in 32 bits", p.span)
            v = torch.as_tensor(np.asarray(value, dtype=np.float64 if dtype == torch.float32 else np.int64),
                                dtype=dtype).to(self.device, non_blocking=True)
        dims = len(shape)
        if v.dim() == dims + 1 and v.shape[0] in (1, self.batch):
            v = v.expand(self.batch, *v.shape[1:])
        elif v.dim() == dims:
            v = v.unsqueeze(0).expand(self.batch, *v.shape)
        else:
            raise BindError(f"parameter '{p.name}': a value of shape {tuple(v.shape)}; expected "
                            f"{self._shape_text(shape)}, or one per batch element ({self.batch}, ...)", p.span)
        for want, got in zip(shape, v.shape[1:]):
            if want is not None and want != got:
                raise BindError(f"parameter '{p.name}': a value of shape {tuple(v.shape)}; expected "
                                f"{self._shape_text(shape)}, or one per batch element", p.span)
        return v

    @staticmethod
    def _shape_text(shape) -> str:
        return "a number" if not shape else "(" + ", ".join("n" if s is None else str(s) for s in shape) + ")"

    def _count(self, v: "torch.Tensor", p: ir.Param, seg: str) -> int:
        """How many entries ``v`` ([B, n]) gives of ``seg``'s capacity (a BindError past it)."""
        cap = self.capacity[seg]
        if v.shape[1] > cap:
            raise BindError(f"'{p.name}' has {v.shape[1]} entries, more than max_segments = {cap} of '{seg}'",
                            p.span, "raise max_segments (bind_on_device(..., max_segments=N))")
        return int(v.shape[1])

    def _origin(self, p: ir.Param) -> "torch.Tensor":
        """A segments parameter's origin per batch element (int64 [B]): its ``from`` expression over the table's
        int parameters, 0 without one."""
        import torch

        if p.origin is None:
            return torch.zeros(self.batch, dtype=torch.int64, device=self.device)
        value = as_tensor_on(self.device, TableInts(self).int(p.origin, None, None), torch.int64)
        return value.reshape(-1).expand(self.batch)

    # -- reading back -------------------------------------------------------------------------------------
    def host_values(self, table: np.ndarray) -> dict:
        """The values ``table`` (this table read back: int64 [B, width]) holds, as :meth:`maskc.CompiledMask.bind`
        takes them (one list per parameter for a batch), seq_len, kv_len and num_heads included."""
        per = [self._element(row) for row in table]
        out: dict = {"seq_len": self.seq_len, "kv_len": self.kv_len}
        if self.num_heads is not None:
            out["num_heads"] = self.num_heads
        for name in per[0]:
            out[name] = per[0][name] if self.batch == 1 else [e[name] for e in per]
        return out

    def _element(self, row: np.ndarray) -> dict:
        values: dict = {}
        for p in self.resolved.params:
            if p.kind == "int":
                values[p.name] = int(row[self.layout.int_slot(p.name)])
            elif p.kind == "segments":
                at, cap = self.segment_at[p.name], self.capacity[p.name]
                values[p.name] = np.diff(row[at + 1:at + 2 + cap]).tolist()
            elif p.kind == "per":
                seg = _segments_of(p)
                cap = self.capacity[seg]
                at = self.segment_at[seg] + 2 + cap * (1 + self.layout.array_slot(p.name))
                values[p.name] = row[at:at + cap].tolist()
            elif p.kind == "table":
                at, shape = self.table_at[p.name] + 1, self.shapes[p.name]
                values[p.name] = row[at:at + int(np.prod(shape))].reshape(shape).tolist()
            elif p.kind == "float":
                values[p.name] = float(np.int32(row[self.layout.float_slot(p.name)]).view(np.float32))
            else:
                at, count = self.float_at[p.name] + 1, self.float_counts[p.name]
                values[p.name] = row[at:at + count].astype(np.int32).view(np.float32).astype(float).tolist()
        return values


def _segments_of(p: ir.Param) -> str:
    """The segments parameter a per-segment array belongs to."""
    assert p.of is not None, p
    return p.of
