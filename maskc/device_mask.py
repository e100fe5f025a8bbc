"""A mask bound on the GPU (:class:`DeviceMask`): its parameter table in a device buffer of fixed size, its
descriptor built there by a generated kernel from the same per-row interval formulas the predicate uses, and
new values written with :meth:`DeviceMask.update` (a copy per value into a staging buffer, then one generated
kernel that writes the table and checks it: segments, `require` rules, 32-bit ranges): no host synchronisation,
no host round trip, so a training step that re-binds the mask (new document lengths every batch) and runs
attention forward and backward can be captured once in a CUDA graph and replayed::

    dm = maskc.load("examples/document.mask").bind_on_device(seq_len=S, docs=[S], max_segments=64)
    lengths = torch.zeros(64, dtype=torch.int32, device="cuda")      # the graph's input
    ... capture: dm.update(docs=lengths); loss = f(maskc.attention(q, k, v, dm)); loss.backward()
    ... each step: lengths.copy_(new_lengths); graph.replay()

The host path (:class:`~maskc.bound.BoundMask`) stays the oracle: :meth:`DeviceMask.to_host` binds the values the
device table holds on the host, and its descriptor equals the device's array for array (exact masks, runs within
the capacity). Masks linear in k only (the examples but the chunked and the sound ones).
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from maskc.analysis.values import INT32
from maskc.call_params import merged, own_keywords
from maskc.errors import BindError
from maskc.kernel_ir import BackwardSpec, KernelSpec
from maskc.runtime import handles

if TYPE_CHECKING:
    from maskc.bound import BoundMask
    from maskc.compiled import CompiledMask

RUN_BYTES = 12
MAX_RUNS = 2 ** 31 - 2          # runs one view holds at most (its offsets are int32)
NO_ELEMENT = INT32              # the first failing batch element's atomicMin start: none has failed (the validate
                                # kernel resets its scratch words to it, 0x7fffffff, after each check)


class DeviceMask:
    """A compiled mask bound on a device (see the module docstring); made by
    :meth:`maskc.CompiledMask.bind_on_device`. Reads like a :class:`~maskc.bound.BoundMask` where the runtime reads
    one (``seq_len``, ``kv_len``, ``batch``, ``num_heads``, ``kernel_spec``), so ``maskc.attention`` takes it."""

    def __init__(self, mask: "CompiledMask", host: "BoundMask", capacity: dict[str, int], device,
                 max_bytes: int | None):
        import torch

        from maskc.codegen.descriptor_build import unsupported
        from maskc.runtime.device_table import DeviceTable

        reason = unsupported(mask.ranges)
        device = torch.device(device if device is not None else "cuda")
        if reason is not None and device.type == "cuda":
            raise BindError(f"mask '{mask.name}' cannot be bound on the device: {reason}", mask.resolved.span,
                            "bind it on the host (mask.bind(...)): its descriptor is built there")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BindError(f"mask '{mask.name}': bind_on_device needs a CUDA GPU, and torch sees none",
                            hint='device="cpu" binds the same table on the CPU (the reference path)')
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.mask, self.capacity, self.max_bytes = mask, capacity, max_bytes
        self._table = DeviceTable(mask.ranges, mask.resolved, host, capacity, device)
        self.device = self._table.device
        self.constants = host.constants
        self.narrow = False                 # no binding proves the next values' forms fit in 32 bits
        self._version = 0
        self._host = (0, host)
        self._builders: dict[tuple[int, int], Any] = {}
        self._status = torch.zeros(4, dtype=torch.int32, device=self.device)
        self._status[3] = NO_ELEMENT
        self._spec = self._kernel = None
        self.handle = handles.register(self)            # as BoundMask's: the torch ops look it up
        self.handle_array = handles.as_array(self.handle)
        # the handle as the tensor torch.compile's graphs pass: update() mutates it (a custom op), attention reads it
        self.token = torch.tensor(self.handle, dtype=torch.int64)
        if self.device.type == "cuda":
            self._validate()

    # -- what the runtime reads of a bound mask --------------------------------------------------------
    seq_len = property(lambda self: self._table.seq_len)
    kv_len = property(lambda self: self._table.kv_len)
    batch = property(lambda self: self._table.batch)
    num_heads = property(lambda self: self._table.num_heads)

    @property
    def version(self) -> int:
        """How many times the values changed (:meth:`update`); descriptors are rebuilt when it moves."""
        return self._version

    @property
    def table(self):
        """The parameter table, int32 [batch, width] on the device (``pack_mask_data``'s layout, segments padded
        to their capacity with empty ones): what the kernels read."""
        return self._table.data

    def kernel_spec(self, **kwargs) -> KernelSpec:
        return self.mask.kernel_spec(constants=self.constants, narrow=False, **kwargs)

    def backward_spec(self, **kwargs) -> BackwardSpec:
        return self.mask.backward_spec(constants=self.constants, narrow=False, **kwargs)

    def __repr__(self) -> str:
        shown = [f"seq_len={self.seq_len}"] + ([f"kv_len={self.kv_len}"] if self.kv_len != self.seq_len else [])
        shown += [f"num_heads={self.num_heads}"] if self.num_heads else []
        shown += [f"batch={self.batch}"] if self.batch > 1 else []
        shown += [f"max_segments={self.capacity}"] if self.capacity else []
        return f"DeviceMask({self.mask.name}: {', '.join(shown)}, device={self.device})"

    # -- new values -------------------------------------------------------------------------------------
    def update(self, *, params: Mapping[str, Any] | None = None, **values: Any) -> "DeviceMask":
        """Write new values: an int parameter as a number or a tensor (one value, or one per batch element),
        segments as their lengths ``[n]`` or ``[batch, n]`` (n up to max_segments; the rest become empty
        segments), per-segment arrays likewise, tables and floats in their bound shapes. Tensors on the device
        are read by the GPU only: nothing is synchronised, and inside a CUDA graph capture the graph reads them
        when replayed (give tensors there: a host value would be baked in). Checked on the device (segments that
        do not partition their range, `require` rules, 32-bit ranges: :meth:`check` reports them; meanwhile
        nothing is visible); const parameters cannot change. Descriptors are rebuilt when next used. Under
        torch.compile it is one custom op (give tensors: a number is a constant of the graph). Values come as
        keyword arguments and/or as ``params=``, a mapping (:mod:`maskc.call_params`)."""
        import torch

        values = merged("update", params, values)
        if torch.compiler.is_compiling():
            from maskc.runtime.device_ops import update_device_mask
            names = sorted(values)
            update_device_mask(self.token, ",".join(names), [torch.as_tensor(values[n]) for n in names])
            return self
        self._table.write(values)
        self._version += 1
        if self.device.type == "cuda":
            self._validate()
        else:
            self._table.apply()
        return self

    def _validate(self) -> None:
        """The builder's ``validate`` kernel, one launch: the staged values into the table, the segments'
        bounds, and every check (segments, `require` rules at the positions bind checks them, for every head the
        mask reads, values past 32 bits) into the status word."""
        import torch

        launch = self.__dict__.get("_validate_launch")
        if launch is None:
            import cupy

            from maskc.runtime.launch import PackedLaunch

            kernel, spec = self._builder_kernel()
            heads = (self.num_heads or 1) if self.mask.ranges.uses_head else 1
            self._scratch = torch.tensor([0, NO_ELEMENT, 0, NO_ELEMENT, 0], dtype=torch.int32, device=self.device)
            launch = self._validate_launch = PackedLaunch(
                kernel.functions[spec.entry_for("validate")],
                (cupy.asarray(self._table.stage.view(-1)), cupy.asarray(self._table.data.view(-1)),
                 cupy.asarray(self._table.offsets), np.int32(self._table.width), np.int32(heads),
                 cupy.asarray(self._scratch), cupy.asarray(self._status)),
                (self.batch, 1, 1), (spec.threads, 1, 1))
        launch(torch.cuda.current_stream(self.device).cuda_stream)

    # -- the descriptor on the device -------------------------------------------------------------------
    def _builder_kernel(self):
        """(LoadedKernel, BuilderSpec) of the builder, for the device's own target; kept on the compiled mask
        (per constants and target), so that a new device bind of the same mask renders nothing."""
        if self._kernel is None:
            from maskc.codegen.descriptor_build import builder_spec, emit_descriptor_builder
            from maskc.codegen.schedule import arch_for
            from maskc.runtime.loader import load_kernel
            from maskc.runtime.state import device_capability, state_for

            arch = arch_for(device_capability(self.device.index))
            mask_state = state_for(self.mask)
            key = ("descriptor builder", self.constants, arch)
            if key not in mask_state:
                spec = builder_spec(self.mask._c_name(), self.mask.ranges, self.constants,
                                    self.mask._summary(self.constants), arch, self.mask.resolved)
                mask_state[key] = (load_kernel(emit_descriptor_builder(spec)), spec)
            self._kernel, self._spec = mask_state[key]
        return self._kernel, self._spec

    def _builder(self, block_m: int, block_n: int):
        from maskc.analysis.bind import check_blocks
        from maskc.runtime.device_builder import DescriptorBuilder

        block_m, block_n = check_blocks(block_m, block_n)
        builder = self._builders.get((block_m, block_n))
        if builder is None:
            if self.device.type != "cuda":
                raise BindError("a mask bound on the CPU has no device descriptor: the CPU path reads its dense "
                                "form (to_host())")
            kernel, spec = self._builder_kernel()
            heads = (self.num_heads or 1) if self.mask.ranges.uses_head else 1
            builder = DescriptorBuilder(kernel, spec, self._table, self._status, heads, block_m, block_n,
                                        self._capacity(block_m, block_n, heads))
            self._builders[block_m, block_n] = builder
        return builder

    def _capacity(self, block_m: int, block_n: int, heads: int) -> tuple[int, int]:
        """Runs each view holds: from ``max_bytes`` (half each), else enough for a few runs per slot of every
        row and head plus a few per segment (exact masks rarely need more; past it, see :meth:`check`)."""
        from maskc.runtime.device_builder import fixed_bytes

        rows = self.batch * -(-self.seq_len // block_m)
        cols = self.batch * -(-self.kv_len // block_n)
        if self.max_bytes is not None:
            half = self.max_bytes // 2
            row_cap, col_cap = (min((half - fixed_bytes(n)) // RUN_BYTES, MAX_RUNS) for n in (rows, cols))
            caps = (row_cap, col_cap)
            need = 2 * (fixed_bytes(max(rows, cols)) + RUN_BYTES * max(rows, cols))
            if min(c - n for c, n in zip(caps, (rows, cols))) < 0:
                raise BindError(f"max_bytes = {self.max_bytes} leaves no room for one run per row block and column "
                                f"at {block_m} x {block_n} tiles (at least {need} bytes)")
            return caps
        slots = len(self.mask.ranges.allow) + len(self.mask.ranges.deny)
        segments = self.batch * sum(self.capacity.values())
        row_cap, col_cap = (min(n * 3 * (slots * heads + 1) + 6 * segments + 16, MAX_RUNS) for n in (rows, cols))
        return row_cap, col_cap

    def build_views(self, views, stream: int) -> None:
        """Bring the descriptor views ``views`` ((block_m, block_n, transposed), ...) to the current values,
        launching on ``stream`` (what the runtime calls before each launch that reads them)."""
        import torch

        current = torch.cuda.current_stream(self.device)
        context = contextlib.nullcontext() if current.cuda_stream == stream else torch.cuda.stream(
            torch.cuda.ExternalStream(stream, device=self.device))
        with context:
            for block_m, block_n, transposed in views:
                self._builder(block_m, block_n).build(self._version, stream, transposed)

    def device_descriptor(self, block_m: int, block_n: int, transposed: bool = False):
        """The view the runtime launches with (:class:`maskc.runtime.state.DeviceDescriptor`): buffers that never
        move, rewritten by :meth:`build_views`."""
        builder = self._builder(block_m, block_n)
        if transposed:
            builder.ensure_cols()
        return builder.device_descriptor(transposed)

    def descriptor_arrays(self, block_m: int = 128, block_n: int = 128) -> dict[str, np.ndarray]:
        """The descriptor built on the device for these tiles, read back as numpy arrays named as the host
        Descriptor's (run_offsets, runs, work_order, col_offsets, col_runs, col_work_order, mask_data,
        mask_offsets) plus each view's ``info`` (rows kept exact, runs, overflowed): tests and debugging."""
        import torch

        self.build_views(((block_m, block_n, True),), torch.cuda.current_stream(self.device).cuda_stream)
        builder = self._builder(block_m, block_n)
        rows, cols = builder.rows.arrays(), builder.cols.arrays()
        return {"run_offsets": rows["offsets"], "runs": rows["runs"], "work_order": rows["order"],
                "col_offsets": cols["offsets"], "col_runs": cols["runs"], "col_work_order": cols["order"],
                "mask_data": self._table.data.reshape(-1).cpu().numpy(),
                "mask_offsets": self._table.offsets.cpu().numpy(), "info": rows["info"], "col_info": cols["info"]}

    # -- reading back: checks and the host's oracle (each synchronises) ------------------------------------
    def status(self) -> dict[str, Any]:
        """The device's checks of the current values and whether any built view overflowed its capacity:
        ``{"segments": [names], "requires": [rule indices], "range": bool, "batch_element": int | None,
        "overflowed": [(block_m, block_n, "rows" | "columns")]}``. Reads the GPU."""
        if self.device.type != "cuda":
            return {"segments": [], "requires": [], "range": False, "batch_element": None, "overflowed": []}
        from maskc.runtime.device_table import MAX_REQUIRE_BITS, RANGE_BIT

        words = self._status.cpu().numpy().tolist()
        segments = [p.name for p in self.mask.ranges.params if p.kind == "segments"]
        first = min(words[1], words[3])
        overflowed = [(bm, bn, name) for (bm, bn), b in self._builders.items()
                      for name, view in (("rows", b.rows), ("columns", b.cols))
                      if view is not None and view.version == self._version and int(view.info[2].item())]
        return {"segments": [s for i, s in enumerate(segments) if words[0] >> i & 1],
                "requires": [i for i in range(MAX_REQUIRE_BITS) if words[2] >> i & 1],
                "range": bool(words[2] >> RANGE_BIT & 1), "batch_element": first if first < NO_ELEMENT else None,
                "overflowed": overflowed}

    def check(self) -> "DeviceMask":
        """A BindError naming the parameter (or rule) where the device found the current values invalid, or
        the memory cap where a descriptor view ran out of room (its last rows were then made PARTIAL over their
        hull: right, but slower); this mask otherwise. Reads the GPU: call it after the first steps, or now
        and then. A mask on the CPU checks everything on the host (to_host)."""
        if self.device.type != "cuda":
            self.to_host()
            return self
        s = self.status()
        at = f" (batch element {s['batch_element']})" if self.batch > 1 and s["batch_element"] is not None else ""
        if s["segments"]:
            p = self.mask.resolved.param(s["segments"][0])
            extent = "seq_len" if p.over == "q" else "kv_len"
            raise BindError(f"segments '{p.name}'{at} do not partition their range: a negative length, or lengths "
                            f"that do not add up to {extent} minus their start", p.span)
        if s["requires"]:
            rule = self.mask.resolved.requires[s["requires"][0]]
            raise BindError(f"requirement not met{at}", rule.span)
        if s["range"]:
            raise BindError(f"mask '{self.mask.name}': a value given as a tensor does not fit in 32 bits")
        if s["overflowed"]:
            bm, bn, view = s["overflowed"][0]
            raise BindError(f"the {view} of the descriptor of {self!r} at {bm} x {bn} tiles ran past its capacity "
                            f"({self._builders[bm, bn].capacity} runs): its last {view} were made one PARTIAL run "
                            "over their hull (right, but slower)", hint="raise it: bind_on_device(..., max_bytes=N)")
        return self

    def to_host(self) -> "BoundMask":
        """The values the device table holds, bound on the host (every check of ``bind``: a BindError where they
        are invalid): the oracle of the device's descriptor, and the CPU's path. Reads the device."""
        version, host = self._host
        if version == self._version:
            return host
        from maskc.codegen.predicate import pack_mask_data

        table = self._table.data.cpu().numpy().astype(np.int64)
        host = self.mask.bind(**self._table.host_values(table))
        data, _ = pack_mask_data(self.mask.ranges, host.params)
        if not np.array_equal(data, table.reshape(-1)):
            raise RuntimeError(f"{self!r}: the table on the device does not hold the values it decodes to (a segment "
                               "table's start is not its origin?)")
        self._host = (self._version, host)
        return host

    def dense(self, batch_index: int = 0, head: int = 0) -> np.ndarray:
        """The current mask, by brute force on the host (the CPU's reference path; small sizes)."""
        return self.to_host().dense(batch_index, head)

    def flex_score_mod(self, device=None):
        return self.to_host().flex_score_mod(device)


def bind_on_device(mask: "CompiledMask", seq_len: int, kv_len: int | None = None, num_heads: int | None = None, *,
                   max_segments: int | dict[str, int] | None = None, device=None, max_bytes: int | None = None,
                   params: Mapping[str, Any] | None = None, **values: Any) -> DeviceMask:
    """:meth:`maskc.CompiledMask.bind_on_device`: the initial values are bound (and checked) on the host, their
    segments padded to their capacity."""
    from maskc.runtime.device_table import capacities, pad_segments

    own = {"device": (device is not None, "device"), "max_segments": (max_segments is not None, "segment capacity"),
           "max_bytes": (max_bytes is not None, "descriptor memory cap")}
    with own_keywords("bind_on_device", mask.resolved, params, own):
        values = merged("bind_on_device", params, values)
        capacity = capacities(mask.resolved, values, max_segments)
        padded = pad_segments(mask.resolved, values, capacity)
        host = mask.bind(seq_len, kv_len, num_heads, **padded)
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer))
                                  or max_bytes < 1):
        raise BindError(f"max_bytes (the device descriptor's memory cap) must be a positive integer, got {max_bytes!r}")
    return DeviceMask(mask, host, capacity, device, None if max_bytes is None else int(max_bytes))
