"""``maskc explain``: every stage of the compiler, printed readably. Pure functions returning strings.

One function per stage (``source_text``, ``resolved_text``, ``normal_text``, ``ranges_text``; at run time
``bind_text``, ``classify_text``, ``pack_text``; for the kernel ``predicate_text``, ``schedule_text``,
``emit_text``); ``explain`` strings them together in pipeline order, each under the one-line why that
:mod:`maskc.pipeline` gives it (``PASSES``, ``RUN_TIME_STAGES``, ``KERNEL_STAGES``).
"""
from __future__ import annotations

import numpy as np

from maskc import ir
from maskc.analysis.chunks import chunk_definition
from maskc.analysis.forms import render, render_term
from maskc.errors import MaskError
from maskc.ir.text import cond_text, expr_text
from maskc.options import DEFAULT, Options
from maskc.pipeline import KERNEL_STAGES, ORDER_STAGE, PASSES, RUN_TIME_STAGES, BoundMask, CompiledMask
from maskc.show import legend


# -- stage 1: what the user wrote -------------------------------------------------------------

def _span_text(span) -> str:
    """The exact text a node was parsed from (one line at most)."""
    return span.source_line[span.col - 1: span.col - 1 + span.length].strip()


def _line_text(span) -> str:
    """The source line, without its comment."""
    return span.source_line.split("#")[0].strip()


def _param_decl(p: ir.ParamDecl) -> str:
    default = f" = {_span_text(p.default.span)}" if p.default is not None else ""
    if p.kind == "float":
        return f"{p.name}: float{default}"
    if p.kind == "float_table":
        return f"{p.name}: float " + (f"per {p.of}{default}" if p.of else "table")
    if p.kind == "per":
        return f"{p.name}: per {p.of}" + (f" = {_span_text(p.default.span)}" if p.default is not None else "")
    if p.kind == "table":
        sizes = "" if p.sizes is None else f"[{', '.join(_span_text(e.span) for e in p.sizes)}]"
        return f"{p.name}: {'per h ' if p.of == 'h' else ''}table{sizes}"
    if p.kind == "segments":
        return f"{p.name}: segments" + (" over k" if p.over == "k" else "") + (
            f" from {_span_text(p.origin.span)}" if p.origin is not None else "")
    return f"{p.name}: int" + (f" = {_span_text(p.default.span)}" if p.default is not None else "")


def source_text(file: ir.SourceFile) -> str:
    """The parsed file: imports, and per mask its parameters, lets and rules (as written)."""
    lines = [f"import {i.path!r}   ({i.span})" for i in file.imports]
    for m in file.masks:
        lines.append(f"mask {m.name}({', '.join(_param_decl(p) for p in m.params)})   ({m.span})")
        for let in m.lets:
            lines.append(f"  line {let.span.line:<4} let      {_line_text(let.span).removeprefix('let').strip()}")
        for r in m.rules:
            text = _line_text(r.span).removeprefix(r.kind).strip()
            lines.append(f"  line {r.span.line:<4} {r.kind:<8} {text}   ({len(r.conditions)} condition(s))")
        for s in m.scores:
            lines.append(f"  line {s.span.line:<4} score    {_line_text(s.span).removeprefix('score').strip()}")
    return "\n".join(lines) or "(no masks)"


# -- stage 2: the resolved mask (its expressions as text: maskc.ir.text) ------------------------

def _param_text(p: ir.Param) -> str:
    if p.kind == "float":
        return f"{p.name}: float" + (f" = {p.default}" if p.default is not None else "")
    if p.kind == "float_table":
        return f"{p.name}: float " + (f"per {p.of}" + (f" = {p.default}" if p.default is not None else "")
                                      if p.of else "table")
    if p.kind == "int":
        return f"{p.name}: int" + (f" = {p.default}" if p.default is not None else "")
    if p.kind == "segments":
        return f"{p.name}: segments" + (" over k" if p.over == "k" else "") + (
            f" from {expr_text(p.origin)}" if p.origin is not None else "")
    if p.kind == "table" and p.dims > 0:
        sizes = "" if p.shape is None else f"[{', '.join(expr_text(e) for e in p.shape)}]"
        return f"{p.name}: {'per h ' if p.of == 'h' else ''}table{sizes}"
    return f"{p.name}: per {p.of}" + (f" = {p.default}" if p.default is not None else "")


def resolved_text(m: ir.ResolvedMask) -> str:
    lines = [f"mask {m.name}({', '.join(_param_text(p) for p in m.params)})"]
    lines += [f"  {r.kind:<7} {cond_text(r.cond)}   (line {r.span.line})" for r in m.rules]
    if m.score is not None:
        from maskc.codegen.score import describe
        lines.append(f"  {describe(m.score)}   (line {m.score.span.line}; the scaled score of a visible pair, "
                     "before the softmax)")
    return "\n".join(lines)


# -- stage 3: normal form ---------------------------------------------------------------------

def region_text(region: ir.Region) -> str:
    return " and ".join(f"{render(a.lin)} <= 0" for a in region.atoms) or "true"


def normal_text(n: ir.NormalMask) -> str:
    lines = [f"visible(q, k) = any of {len(n.allow)} allow region(s) and none of {len(n.deny)} deny region(s)"]
    for kind, regions in (("allow", n.allow), ("deny", n.deny)):
        lines += [f"  {kind} [{i}] {region_text(r)}   (line {r.span.line})" for i, r in enumerate(regions)]
    if n.divisors:
        lines.append("  divisors (must be > 0 at bind): " + ", ".join(render(d) for d in n.divisors))
    return "\n".join(lines)


# -- stage 4: range analysis ------------------------------------------------------------------

def _kbound(b: ir.KBound, rounding: str) -> str:
    return render(b.lin) if b.den == 1 else f"{rounding}(({render(b.lin)}) / {b.den})"


def _range_text(name: str, level: ir.ChunkLevel) -> str:
    lower = ", ".join(_kbound(b, "ceil") for b in level.lower) or "0"
    upper = ", ".join(_kbound(b, "floor") for b in level.upper) or "kv_len - 1"
    lower = f"max({lower})" if len(level.lower) > 1 else lower
    upper = f"min({upper})" if len(level.upper) > 1 else upper
    return f"{name} from {lower} to {upper}"


def chunks_text(chunks: ir.ChunkedKeys) -> list[str]:
    """A chunked region's keys per row: the chunk indices, then each level's range, outermost first."""
    defined = [f"{render_term(ir.ChunkVar(i + 1))} = {chunk_definition(level)}"
               for i, level in enumerate(chunks.levels[:-1])]
    lines = ["exact, one interval of keys per chunk" + (f": {', '.join(defined)}" if defined else "")]
    if chunks.guards:
        lines.append("  where " + " and ".join(f"{render(a.lin)} <= 0" for a in chunks.guards))
    for depth, level in enumerate(reversed(chunks.levels)):
        last = depth == len(chunks.levels) - 1
        name = "keys k" if last else f"each {render_term(level.var)}"
        lines.append("  " * (depth + 1) + _range_text(name, level))
    return lines


def bounds_text(r: ir.RegionBounds) -> list[str]:
    lines = []
    if r.static_guards:
        lines.append("exists if: " + " and ".join(f"{render(a.lin)} <= 0" for a in r.static_guards))
    if r.guards:
        lines.append("guards: " + " and ".join(f"{render(a.lin)} <= 0" for a in r.guards))
    lower = ", ".join(_kbound(b, "ceil") for b in r.lower) or "0"
    upper = ", ".join(_kbound(b, "floor") for b in r.upper) or "kv_len - 1"
    lines.append(f"k >= max({lower})" if len(r.lower) > 1 else f"k >= {lower}")
    lines.append(f"k <= min({upper})" if len(r.upper) > 1 else f"k <= {upper}")
    if r.opaque:
        lines.append("opaque (checked per pair): " + " and ".join(f"{render(a.lin)} <= 0" for a in r.opaque))
    if r.chunks is not None:
        lines += chunks_text(r.chunks)
    elif r.inexact is not None:
        lines.append(f"not exact, tiles it touches are only sound: {r.inexact.reason} ({r.inexact.atom.span})")
    else:
        lines.append("exact")
    return lines


def ranges_text(r: ir.RangeMask) -> str:
    inexact = sum(region.inexact is not None for region in r.allow + r.deny)
    lines = [f"tile classes are exact for this mask" if r.exact else
             f"tile classes are sound but not exact for this mask: {inexact} region(s) read k in a way the "
             "analysis cannot solve"]
    if r.uses_head:
        lines.append("the mask reads h: one tile map serves every head, so a tile is FULL (EMPTY) only where it is "
                     "for every head, and PARTIAL where heads differ, though each head's rows are exact")
    for kind, regions in (("allow", r.allow), ("deny", r.deny)):
        for i, region in enumerate(regions):
            lines.append(f"  {kind} [{i}]   (line {region.span.line})")
            lines += [f"    {line}" for line in bounds_text(region)]
    return "\n".join(lines)


# -- run time: one bound instance -------------------------------------------------------------

def bind_text(bound: BoundMask) -> str:
    """The lengths and each batch element's parameter values (segments as their bounds)."""
    params = bound.params
    head = f"seq_len {bound.seq_len}, kv_len {bound.kv_len}, batch {bound.batch}"
    lines = [head + (f", num_heads {bound.num_heads}" if bound.num_heads else "")]
    for b, element in enumerate(params.batch[:4]):
        values = [f"{n} = {v}" for n, v in element.ints]
        for n, table in element.segments:
            bounds = np.asarray(table.bounds).tolist()
            shown = bounds if len(bounds) <= 9 else bounds[:8] + ["..."]
            values.append(f"{n}: {table.count} segment(s), bounds {shown}")
        for n, lookup in element.tables:
            entries = lookup.values.tolist()
            shape = "" if len(lookup.shape) == 1 else f" ({' x '.join(map(str, lookup.shape))}, row-major)"
            values.append(f"{n}: {lookup.count} entries{shape} {entries if len(entries) <= 9 else entries[:8] + ['...']}")
        lines.append(f"  element {b}: " + ("; ".join(values) or "(no parameters)"))
    if bound.batch > 4:
        lines.append(f"  ... {bound.batch - 4} more batch elements")
    return "\n".join(lines)


def classify_text(bound: BoundMask, block_m: int = 128, block_n: int = 128) -> str:
    tiles = bound.tile_map(block_m, block_n)
    if tiles.exact:
        why = "exact" if bound.mask.exact else "exact for these values (once bound, the divisors are numbers)"
    elif bound.mask.exact and not bound.mask.ranges.uses_head:
        why = "sound, not exact: the chunked regions have more intervals than classification enumerates"
    else:
        why = "sound (not exact)" + (": tiles hold for every head" if bound.mask.ranges.uses_head else
                                     ": see the ranges stage for the cause")
    return "\n".join([f"tiles {block_m}x{block_n}: {legend(tiles.counts())}", f"classes are {why}"])


def pack_text(bound: BoundMask, block_m: int = 128, block_n: int = 128, descriptor_lines: int = 8) -> str:
    desc = bound.descriptor(block_m, block_n)
    lines = [f"descriptor: {desc.runs.shape[0]} runs over {desc.run_offsets.size - 1} row blocks, "
             f"{desc.mask_data.size} mask_data ints"]
    kinds = {1: "PARTIAL", 2: "FULL"}
    for r in range(min(descriptor_lines, desc.run_offsets.size - 1)):
        runs = desc.runs[desc.run_offsets[r]:desc.run_offsets[r + 1]]
        text = ", ".join(f"kv [{b}, {e}) {kinds[int(k)]}" for b, e, k in runs) or "(no keys)"
        lines.append(f"  row block {r}: {text}")
    if desc.run_offsets.size - 1 > descriptor_lines:
        lines.append(f"  ... {desc.run_offsets.size - 1 - descriptor_lines} more row blocks")
    lines.append(f"  work_order[:8] = {np.asarray(desc.work_order[:8]).tolist()}")
    return "\n".join(lines)


def bound_text(bound: BoundMask, block_m: int = 128, block_n: int = 128, descriptor_lines: int = 8) -> str:
    """The three run-time stages of one bound mask together."""
    return "\n".join([bind_text(bound), classify_text(bound, block_m, block_n),
                      pack_text(bound, block_m, block_n, descriptor_lines)])


def order_text(mask: CompiledMask, bound: BoundMask | None, options: Options = DEFAULT) -> str:
    """The image a mask reads positions on and the token orders tried for it (maskc.ordered), or why it runs in
    raster order; for a bound mask, the order ``options.token_order`` picks and the tiles in it and in raster."""
    from maskc.analysis.normalize import specialize
    from maskc.analysis.order import candidates, image_grid
    from maskc.ordered import TILE, token_order
    constants = _kernel_constants(mask, bound)
    if isinstance(constants, str):
        return "raster: " + constants
    grid = image_grid(mask.resolved, specialize(mask.normal, dict(constants)))
    if isinstance(grid, str):
        return f"raster only: {grid}"
    tried = ", ".join(o.name for o in candidates(grid, TILE[1])) or "none"
    lines = [f"image: rows {grid.width} wide from position {grid.origin}; patch orders tried at bind: {tried}"]
    if bound is not None:
        try:
            ordered = token_order(bound, options)
        except MaskError as err:
            return "\n".join(lines + [f"token_order={options.token_order}: {err.message}"])
        raster = legend(bound.tile_map(*TILE).counts())
        if ordered is None:
            lines.append(f"token_order={options.token_order}: raster (tiles {TILE[0]}x{TILE[1]}: {raster})")
        else:
            tiles = legend(ordered.inner.tile_map(*TILE).counts())
            lines.append(f"token_order={options.token_order}: {ordered.order} (tiles {TILE[0]}x{TILE[1]}: "
                         f"{tiles}; raster: {raster})")
    return "\n".join(lines)


# -- the kernel: predicate, schedule, emit ----------------------------------------------------

def _kernel_constants(mask: CompiledMask, bound: BoundMask | None) -> tuple[tuple[str, int], ...] | str:
    """The const parameters' values (the bound mask's, else the file's defaults), or why there are none."""
    try:
        return bound.constants if bound is not None else mask.const_values()
    except MaskError as err:
        return (f"(no kernel: {err.message}; bind it with --seq-len and --param, or declare defaults in "
                "the file)")


def predicate_text(mask: CompiledMask, constants: tuple[tuple[str, int], ...]) -> str:
    """The device code that decides visibility on PARTIAL tiles (``mask_row`` / ``mask_visible``), without
    the helper functions every predicate shares."""
    return mask.kernel_spec(constants=constants, engine="mma").predicate.code.strip("\n")


def schedule_text(head_dim: int, dtype: str, options: Options = DEFAULT, mask: CompiledMask | None = None,
                  bound: BoundMask | None = None) -> str:
    """The tiles and engines the schedule picks for the forward and backward kernels (the engines of
    ``options`` where they name one); for a mask with a score modifier, how the forward's softmax runs (against
    a fixed maximum where ``bound``'s values allow it: ForwardPlan.fixed_max)."""
    from maskc.codegen.schedule import HOPPER, capability_of, choose_backward_tiles, choose_tiles
    capability = capability_of(options.arch) if options.arch else HOPPER
    fwd = choose_tiles(head_dim, dtype, capability, engine=options.engine)
    lines = [f"forward: BLOCK_M {fwd.block_m}, BLOCK_N {fwd.block_n}, {fwd.num_warps} warps, engine {fwd.engine}"
             f" (head_dim {head_dim}, {dtype})"]
    try:
        bwd = choose_backward_tiles(head_dim, dtype, capability, engine=options.backward_engine)
        lines.append(f"backward: {bwd.block_m} queries x {bwd.block_n} keys per dK/dV tile, dQ {bwd.block_m} x "
                     f"{bwd.dq_block_n}, dK/dV engine {bwd.engine}")
    except ValueError as err:
        lines.append(f"backward: none ({err})")
    if mask is not None:
        partial = _partial_text(mask, bound, head_dim, dtype, options)
        lines += [partial] if partial else []
    if mask is not None and mask.resolved.score is not None:
        lines.append(_softmax_text(mask, bound, head_dim, dtype, options))
    return "\n".join(lines)


def _partial_text(mask: CompiledMask, bound: BoundMask | None, head_dim: int, dtype: str,
                  options: Options) -> str | None:
    """One line for a mask with a tile path: how the forward masks its PARTIAL tiles (ForwardPlan.partial_tiles),
    with the stored words' bytes for ``bound``; None for other masks."""
    from maskc.codegen.plan import plan_forward, stored_bytes

    spec = (bound or mask).kernel_spec(head_dim=head_dim, dtype=dtype, engine=options.engine)
    plan = plan_forward(spec, partial=options.partial_tiles)
    if not plan.partial_tiles:
        return None
    if plan.stored:
        size = "" if bound is None else (
            f": {stored_bytes(bound.descriptor(spec.block_m, spec.block_n)) / 2**20:.1f} MiB at these tiles")
        return ("PARTIAL tiles: stored (each tile's visibility words built once per binding, for every head, and "
                f"read per tile{size})")
    why = " (the mask reads h: its words would differ by head)" if spec.predicate.reads_head else ""
    return f"PARTIAL tiles: {plan.partial_tiles}{why}"


def _softmax_text(mask: CompiledMask, bound: BoundMask | None, head_dim: int, dtype: str, options: Options) -> str:
    """One line: whether the forward's softmax runs against a fixed maximum for this binding, and why not."""
    from maskc.codegen.emit import emit_kernel
    from maskc.codegen.plan import FIXED_MAX_CAP

    score = mask.resolved.score
    assert score is not None, "only a mask with a score modifier has a softmax line"
    softcap = isinstance(score.expr, ir.FCall) and score.expr.fn == "softcap"
    if bound is None:
        return "forward softmax: online (row maxima)" + (
            f"; a binding whose caps are all at most {FIXED_MAX_CAP:.1f} runs it against a fixed maximum (give "
            "--seq-len to see)" if softcap else "")
    plan = emit_kernel(bound.kernel_spec(head_dim=head_dim, dtype=dtype, engine=options.engine), options).plan
    if getattr(plan, "fixed_max", False):
        return f"forward softmax: against a fixed maximum (every softcap cap of this binding <= {FIXED_MAX_CAP:.1f})"
    if not softcap:
        why = "the modifier does not bound the scores (only a softcap of the whole score does)"
    elif not bound.fixed_max:
        why = f"a cap of this binding is past {FIXED_MAX_CAP:.1f}"
    else:
        why = "a fixed maximum needs bf16, the wgmma_tma engine and no FMA exponentials"
    return f"forward softmax: online (row maxima): {why}"


def emit_text(mask: CompiledMask, constants: tuple[tuple[str, int], ...], head_dim: int, dtype: str,
              options: Options = DEFAULT) -> str:
    """What the forward template renders: the entry point, its size and NVRTC's options."""
    src = mask.kernel_source(options, head_dim=head_dim, dtype=dtype, constants=constants)
    return "\n".join([f"entry {src.entry}: {src.source.count(chr(10))} lines of CUDA",
                      f"NVRTC options: {' '.join(src.options)}",
                      "(maskc compile writes the source; --check compiles it)"])


def _section(title: str, why: str | None, body: str) -> str:
    head = f"== {title}" + (f": {why}" if why else "")
    return f"{head}\n{body}\n"


def explain(file: ir.SourceFile, masks: tuple[CompiledMask, ...], bounds: dict | None = None,
            block_m: int = 128, block_n: int = 128, head_dim: int = 128, dtype: str = "bf16",
            options: Options = DEFAULT) -> str:
    """Every stage of each mask, in pipeline order; ``bounds`` maps a mask name to a BoundMask (the run-time
    stages are printed for those); ``options``: the engines and switches the kernel stages use."""
    why = {name: text for name, text, _ in PASSES} | dict(RUN_TIME_STAGES) | dict(KERNEL_STAGES)
    out = [_section("parse", "the syntax tree, names not yet looked up", source_text(file))]
    for m in masks:
        out.append(f"######## mask {m.name}\n")
        out.append(_section("resolve", why["resolve"], resolved_text(m.resolved)))
        out.append(_section("normalize", why["normalize"], normal_text(m.normal)))
        out.append(_section("ranges", why["ranges"], ranges_text(m.ranges)))
        bound = (bounds or {}).get(m.name)
        out.append(_section("token order", ORDER_STAGE, order_text(m, bound, options)))
        if bound is not None:
            out.append(_section("bind", why["bind"], bind_text(bound)))
            out.append(_section("classify", why["classify"], classify_text(bound, block_m, block_n)))
            out.append(_section("pack", why["pack"], pack_text(bound, block_m, block_n)))
        constants = _kernel_constants(m, bound)
        if isinstance(constants, str):
            out.append(_section("predicate", why["predicate"], constants))
        else:
            out.append(_section("predicate", why["predicate"], predicate_text(m, constants)))
        out.append(_section("schedule", why["schedule"], schedule_text(head_dim, dtype, options, m, bound)))
        if not isinstance(constants, str):
            out.append(_section("emit", why["emit"], emit_text(m, constants, head_dim, dtype, options)))
    return "\n".join(out)
