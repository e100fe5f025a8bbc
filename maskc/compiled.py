"""The compiled mask: what users hold after compile (:class:`CompiledMask`, every compile-time stage kept), its
kernels' specs and sources for a target, and its const parameters' values; ``bind`` gives a
:class:`~maskc.bound.BoundMask`. The passes are sequenced in :mod:`maskc.pipeline`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from maskc import ir
from maskc.analysis.bind import bind as bind_params
from maskc.analysis.bind import check_constants
from maskc.analysis.normalize import specialize
from maskc.analysis.order import TokenOrder
from maskc.analysis.ranges import analyze_ranges
from maskc.analysis.score import reads_head as score_reads_head
from maskc.analysis.widths import fits_32_bits
from maskc.bound import BoundMask
from maskc.call_params import merged
from maskc.codegen.elements import element_code
from maskc.codegen.predicate import predicate
from maskc.codegen.score import score_code
from maskc.codegen.tile_bits import has_tile_bits
from maskc.errors import BindError, MaskError
from maskc.ir.text import expr_text
from maskc.kernel_ir import BackwardSpec, KernelSource, KernelSpec
from maskc.options import DEFAULT, Options, options_of

if TYPE_CHECKING:
    from maskc.device_mask import DeviceMask


@dataclass(frozen=True, eq=False)
class CompiledMask:
    """A mask taken through every compile-time pass; ``bind`` it to lengths and parameter values."""

    resolved: ir.ResolvedMask
    normal: ir.NormalMask
    ranges: ir.RangeMask
    # Kernels of a sub-block (BoundMask.restrict): positions local to it, its origin read from the table.
    offsets: bool = False
    # The mask rewritten in a token order's coordinates (maskc.pipeline.compile_ordered): the order, and the mask it
    # was rewritten from (whose raster rows classify its tiles: maskc.analysis.order_tiles); else None.
    order: TokenOrder | None = None
    source: "CompiledMask | None" = None

    def __repr__(self) -> str:
        params = ", ".join(_param_repr(p) for p in self.params)
        return (f"CompiledMask({self.name}({params}): {len(self.normal.allow)} allow / {len(self.normal.deny)} deny "
                f"region(s), tiles {'exact' if self.exact else 'sound'}; {self.resolved.span})")

    @property
    def name(self) -> str:
        return self.resolved.name

    def with_offsets(self) -> "CompiledMask":
        """This mask with ``offsets``: what a restricted bound mask compiles (one twin per compiled mask,
        so that every sub-block shares its kernels)."""
        if self.offsets:
            return self
        twin = self.__dict__.get("_with_offsets")
        if twin is None:
            twin = CompiledMask(self.resolved, self.normal, self.ranges, offsets=True, order=self.order,
                                source=self.source)
            self.__dict__["_with_offsets"] = twin
        return twin

    @property
    def params(self) -> tuple[ir.Param, ...]:
        return self.resolved.params

    @property
    def table_regions(self) -> int:
        """Regions of the kernels' interval table for this mask: 0 when it has per-key atoms (no table)."""
        regions = self.ranges.allow + self.ranges.deny
        return 0 if any(r.opaque for r in regions) else len(regions)

    @property
    def reads_head(self) -> bool:
        """Whether binding needs ``num_heads``: the mask or its score modifier reads h."""
        return self.ranges.uses_head or score_reads_head(self.resolved)

    @property
    def exact(self) -> bool:
        """Whether tile classes are exact for this mask (else only sound)."""
        return self.ranges.exact

    def specialized(self, ints: tuple[tuple[str, int], ...]) -> ir.RangeMask:
        """The range analysis with int parameters fixed (regions that cannot hold for these values
        gone), cached per values: a new bind with the same ints pays nothing."""
        cache = self.__dict__.setdefault("_specialized", {})
        hit = cache.get(ints)
        if hit is None:
            if len(cache) >= 256:
                cache.clear()
            hit = cache[ints] = analyze_ranges(specialize(self.normal, dict(ints))) if ints else self.ranges
        return hit

    def bind(self, seq_len: int, kv_len: int | None = None, num_heads: int | None = None, *,
             params: Mapping[str, Any] | None = None, **values: Any) -> "BoundMask":
        """The mask bound to lengths and parameter values, given as keyword arguments and/or as ``params=``, a
        mapping (:mod:`maskc.call_params`)."""
        values = merged("bind", params, values)
        bound = bind_params(self.resolved, self.ranges, seq_len, kv_len, num_heads, **values)
        forms = self._element_ranges(bound.constants(self.const_params)) if bound.narrow else None
        if forms is not None and forms is not self.ranges:
            # a kernel's element path computes these forms (the raster mask's, with its const parameters folded in;
            # in a token order at raster positions, in the same range): 32 bits only where they fit too
            heads = bound.num_heads if forms.uses_head and bound.num_heads else 1
            narrow = all(fits_32_bits(forms, e, bound.seq_len, bound.kv_len, heads, b)
                         for b, e in enumerate(bound.batch))
            if not narrow:              # (narrow is true here: a new BoundParams only where that changes)
                bound = dataclasses.replace(bound, narrow=False)
        return BoundMask(self, bound)

    def bind_on_device(self, seq_len: int, kv_len: int | None = None, num_heads: int | None = None, *,
                       max_segments: int | dict[str, int] | None = None, device=None, max_bytes: int | None = None,
                       params: Mapping[str, Any] | None = None, **values: Any) -> "DeviceMask":
        """Bind on a GPU (:class:`maskc.DeviceMask`): the parameter table in a device buffer of fixed size, the
        descriptor built there by a generated kernel, new values written with ``update`` without a host
        round trip (capturable in a CUDA graph). The initial values (keyword arguments and/or ``params=``) are
        bound and checked as ``bind`` checks them; ``max_segments`` is how many segments each segments parameter
        may hold from now on (an int for all, or by name; default: as many as the initial values have); ``device``
        a torch device (default the current CUDA device; "cpu" runs the host path on the same table); ``max_bytes``
        caps each tile shape's descriptor (default: a few runs per row and slot). Masks linear in k only (a
        BindError otherwise). A mask parameter named like one of these keywords is given in ``params=``
        (:mod:`maskc.call_params`)."""
        from maskc.device_mask import bind_on_device
        return bind_on_device(self, seq_len, kv_len, num_heads, max_segments=max_segments, device=device,
                              max_bytes=max_bytes, params=params, **values)

    @property
    def const_params(self) -> tuple[str, ...]:
        """Int parameters declared ``const``: their values are compiled into the kernel."""
        return tuple(p.name for p in self.params if p.const)

    def kernel_spec(self, head_dim: int = 128, dtype: str = "bf16", block_m: int | None = None,
                    block_n: int | None = None, num_warps: int | None = None,
                    constants: tuple[tuple[str, int], ...] = (), engine: str | None = None,
                    arch: str = "sm_90a", narrow: bool = False, fixed_max: bool = False) -> KernelSpec:
        """The kernel's spec for a target ``arch`` (maskc.codegen.schedule.ARCHES; default an H100/H200); a mask with
        const parameters takes their ``constants`` (a bound mask's), else the defaults its file declares
        (:meth:`const_values`). Tiles and engine not given come from the schedule for that target.
        ``narrow``: the predicate in 32 bits, for a binding that proved it enough (``BoundParams.narrow``);
        ``fixed_max``: the binding's scores bounded for a softmax against a fixed maximum (``BoundMask.fixed_max``)."""
        from maskc.codegen.schedule import capability_of, choose_tiles

        if block_m is None or block_n is None or num_warps is None or engine is None:
            chosen = choose_tiles(head_dim, dtype, capability_of(arch), engine=engine,
                                  table_regions=self.table_regions)
            block_m, block_n = block_m or chosen.block_m, block_n or chosen.block_n
            num_warps, engine = num_warps or chosen.num_warps, engine or chosen.engine
        constants = self.const_values(constants)
        pred = predicate(self.ranges, tuple(constants), self.offsets, narrow, self._element_code(constants))
        return KernelSpec(self._c_name(), head_dim, dtype, block_m, block_n, num_warps, pred, self._summary(constants),
                          engine, arch, score_code(self.resolved, tuple(constants), self.offsets), fixed_max)

    def _element_ranges(self, constants: tuple[tuple[str, int], ...]) -> ir.RangeMask | None:
        """The forms the element path of PARTIAL tiles (maskc.codegen.elements) tests per pair, or None where the
        kernels have no tile path: the raster mask's (the mask this one was rewritten from, when it is in a token
        order), with the const parameters folded in (a floor by a product of them is one by a literal: a shift)."""
        if self.offsets or not has_tile_bits(self.ranges, self.offsets):
            return None
        raster = self.source if self.order is not None and self.source is not None else self
        return raster.specialized(tuple(constants))

    def _element_code(self, constants: tuple[tuple[str, int], ...]) -> str:
        """The element path's code (maskc.codegen.elements), taking places in this mask's token order."""
        forms = self._element_ranges(constants)
        return "" if forms is None else element_code(forms, tuple(constants), self.order)

    def backward_spec(self, head_dim: int = 128, dtype: str = "bf16",
                      constants: tuple[tuple[str, int], ...] = (), engine: str | None = None,
                      arch: str = "sm_90a", dq_reduction: str | None = None, narrow: bool = False,
                      partial_tiles: str = "auto") -> BackwardSpec:
        """The backward kernels' spec for a target ``arch`` (tiles and dK/dV engine from the schedule;
        ``engine`` picks one; ``dq_reduction`` the wgmma kernel's, else the default; ``partial_tiles`` how PARTIAL
        tiles of a mask with a tile path are masked, Options.partial_tiles); const parameters and ``narrow`` as
        for kernel_spec."""
        from maskc.codegen.plan import backward_fits
        from maskc.codegen.schedule import capability_of, choose_backward_tiles, choose_dq_reduction

        constants = self.const_values(constants)
        tiles = choose_backward_tiles(head_dim, dtype, capability_of(arch), engine=engine)
        pred = predicate(self.ranges, tuple(constants), self.offsets, narrow, self._element_code(constants))
        spec = BackwardSpec(self._c_name(), head_dim, dtype, tiles.block_m, tiles.block_n, tiles.dq_block_n, pred,
                            self._summary(constants), tiles.engine,
                            choose_dq_reduction(tiles.engine, dq_reduction, head_dim), arch,
                            score_code(self.resolved, tuple(constants), self.offsets),
                            pred.partial_path(partial_tiles, stored=tiles.engine == "wgmma_tma" and head_dim != 256))
        if spec.partial_tiles == "bits" and pred.elements and not backward_fits(spec):
            # head dim 256 leaves shared memory for few root tables: the element path needs none
            spec = dataclasses.replace(spec, partial_tiles="elements")
        return spec

    def _c_name(self) -> str:
        from maskc.codegen.sanitize import c_identifier
        order = f"_p{self.order.name}" if self.order is not None else ""
        return c_identifier(self.name) + order + ("_sub" if self.offsets else "")

    def const_values(self, given: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> tuple[tuple[str, int], ...]:
        """The value of every const parameter, in declaration order: ``given``, else the default the file
        declares (``width: const int = 128``). A const parameter with neither is a MaskError naming it; a value
        that is not a 32-bit integer, or that makes a divisor or requirement it decides fail, a BindError."""
        try:
            pairs = list(given.items() if isinstance(given, Mapping) else given)
        except TypeError:
            pairs = None
        if pairs is None or isinstance(given, (str, bytes)) or not all(
                isinstance(pair, tuple) and len(pair) == 2 for pair in pairs):
            raise BindError(f"constants of mask '{self.name}' must map const parameter names to integers, "
                            f"got {given!r}", self.resolved.span)
        values = dict(pairs)
        stray = [n for n in values if n not in self.const_params]
        if stray:
            raise MaskError(f"mask '{self.name}' has no const parameter {', '.join(repr(n) for n in stray)}",
                            self.resolved.span, f"its const parameters: {', '.join(self.const_params) or 'none'}")
        for p in self.params:
            if p.const and p.name not in values and p.default is not None:
                values[p.name] = p.default
        missing = [n for n in self.const_params if n not in values]
        if missing:
            raise MaskError(f"mask '{self.name}' compiles its const parameter(s) {', '.join(missing)} into the "
                            "kernel, and the file gives no default: give their values", self.resolved.span,
                            "on the command line: " + " ".join(f"--param {n}=VALUE" for n in missing)
                            + "; in Python: bind the mask first, or pass constants=; or declare a default "
                            f"in the file ('{missing[0]}: const int = ...')")
        return check_constants(self.resolved, self.ranges, {n: values[n] for n in self.const_params})

    def _summary(self, constants) -> tuple[str, ...]:
        sub = ("sub-block: positions local to it, its origin (q0, k0) heads the mask table",) if self.offsets else ()
        order = (f"token order: {self.order} (q, k: places in that order)",) if self.order is not None else ()
        return tuple(_summary_lines(self.resolved)) + tuple(f"const {n} = {v}" for n, v in constants) + order + sub

    def kernel_source(self, options: Options = DEFAULT, **kwargs) -> KernelSource:
        """The forward kernel's CUDA: :meth:`kernel_spec` of ``kwargs`` (engine and target, where they give
        none, those of ``options``), rendered with the switches of ``options``."""
        options = options_of(options, "kernel_source()")
        from maskc.codegen.emit import emit_kernel
        kwargs["engine"] = kwargs.get("engine") or options.engine
        kwargs["arch"] = kwargs.get("arch") or options.arch or "sm_90a"
        return emit_kernel(self.kernel_spec(**kwargs), options)

    def backward_source(self, options: Options = DEFAULT, **kwargs) -> KernelSource:
        """The backward kernels' CUDA: :meth:`backward_spec` of ``kwargs`` (engine, target, dQ reduction and the
        masking of PARTIAL tiles, where they give none, those of ``options``)."""
        options = options_of(options, "backward_source()")
        from maskc.codegen.emit import emit_backward_kernel
        kwargs["engine"] = kwargs.get("engine") or options.backward_engine
        kwargs["arch"] = kwargs.get("arch") or options.arch or "sm_90a"
        kwargs["dq_reduction"] = kwargs.get("dq_reduction") or options.dq_reduction
        kwargs["partial_tiles"] = kwargs.get("partial_tiles") or options.partial_tiles
        return emit_backward_kernel(self.backward_spec(**kwargs))


def _param_repr(p: ir.Param) -> str:
    sizes = "" if p.shape is None else f"[{', '.join(expr_text(e) for e in p.shape)}]"
    table = ("table" if p.of is None else f"per {p.of}" + (" table" if p.dims else "")) + sizes
    kind = {"int": "const int" if p.const else "int", "segments": "segments over k" if p.over == "k" else "segments",
            "per": f"per {p.of}", "table": table,
            "float": "float", "float_table": "float table" if p.of is None else f"float per {p.of}"}[p.kind]
    return f"{p.name}: {kind}" + (f" = {p.default}" if p.default is not None else "")


def _summary_lines(mask: ir.ResolvedMask):
    from maskc.codegen.sanitize import comment_text
    span = mask.span
    yield comment_text(f"mask {mask.name} ({span.label})")
    for r in mask.rules:
        if r.span.source_line:
            yield comment_text(r.span.source_line.strip())
    if mask.score is not None:
        from maskc.codegen.score import describe
        yield comment_text(describe(mask.score) + "   (the scaled score of a visible pair, before the softmax)")
