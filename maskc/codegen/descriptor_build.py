"""The descriptor builder as CUDA: a mask's :class:`~maskc.builder_ir.BuilderSpec` → ``KernelSource``.

The builder computes on the GPU what :mod:`maskc.analysis.classify`, :mod:`maskc.analysis.descriptor` and
:mod:`maskc.analysis.tiles` compute on the host, for masks linear in k (one key interval per row and region):
each row's visible keys come from the predicate's own ``mask_row`` (the same generated code the attention
kernels run: no second copy of the mask's logic), united and subtracted as
:func:`maskc.analysis.intervals.combine` does, and counted per key block into a q_block's classes
(``templates/descriptor_kernels.cu.j2`` says how, kernel by kernel). Everything mask-specific is decided here
and passed in the spec; the template only places it.
"""
from __future__ import annotations

from maskc import ir
from maskc.codegen.cwriter import TableLayout
from maskc.codegen.emit import _environment, nvrtc_options, template_dir
from maskc.codegen.predicate import predicate
from maskc.codegen.require_checks import origin_c, require_checks
from maskc.codegen.sanitize import c_identifier
from maskc.builder_ir import BuilderSpec, SegmentCheck
from maskc.kernel_ir import KernelSource

TEMPLATE_NAME = "descriptor_build.cu.j2"
MAX_SEGMENT_PARAMS = 31     # segments parameters the status word has a bit for


def unsupported(ranges: ir.RangeMask) -> str | None:
    """Why the device builder cannot take this mask (None: it can): it needs every region linear in k."""
    if ranges.linear:
        if sum(p.kind == "segments" for p in ranges.params) > MAX_SEGMENT_PARAMS:
            return f"it has more than {MAX_SEGMENT_PARAMS} segments parameters"
        return None
    if ranges.exact:
        return ("its keys come through // or % of k (chunked regions): their tiles are exact, but only the host "
                "classifies them")
    return "its tiles are only sound (k enters through operations maskc cannot solve): only the host classifies them"


def builder_spec(name: str, ranges: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (),
                 summary: tuple[str, ...] = (), arch: str = "sm_90a",
                 resolved: ir.ResolvedMask | None = None) -> BuilderSpec:
    """The builder's spec for a mask linear in k (see :func:`unsupported`): its predicate with the ``constants``
    compiled in, in 64 bits, its segments parameters' table slots and origins, and (given ``resolved``) its
    `require` rules as C."""
    reason = unsupported(ranges)
    if reason is not None:
        raise ValueError(f"mask '{name}' cannot be classified on the device: {reason}")
    layout = TableLayout.of(ranges.params)
    checks = tuple(SegmentCheck(p.name, layout.seg_slot(p.name), 0 if p.over == "q" else 1, bit,
                                origin_c(p, layout, constants))
                   for bit, p in enumerate(p for p in ranges.params if p.kind == "segments"))
    requires = require_checks(resolved, ranges.params, constants) if resolved is not None else ()
    return BuilderSpec(c_identifier(name), predicate(ranges, constants, offsets=False, narrow=False), checks,
                       requires, summary, arch)


def emit_descriptor_builder(spec: BuilderSpec) -> KernelSource:
    """Render the builder's kernels (``spec.entries``) for ``spec``; the predicate's source is placed verbatim."""
    if spec.window % spec.threads or spec.threads % 32 or spec.threads > 1024:
        raise ValueError(f"builder shape: window {spec.window} must be a multiple of threads {spec.threads}, "
                         "itself whole warps, at most 1024")
    source = _environment(str(template_dir())).get_template(TEMPLATE_NAME).render(spec=spec)
    return KernelSource(spec=spec, source=source, entry=spec.entry, options=nvrtc_options(spec.arch),
                        entries=spec.entries)


def emit_checks(spec: BuilderSpec) -> str:
    """The predicate and the builder's checks of a table (``maskc_check_element``, the rules, the origins) alone,
    without kernels: plain C++ where ``__device__`` and ``__forceinline__`` are defined away (the host's tests
    compile it with g++ and compare it with ``bind``)."""
    env = _environment(str(template_dir()))
    return spec.predicate.source + "\n" + env.get_template("descriptor_checks.cu.j2").render(spec=spec)
