"""The compiler as a list of passes, and the entry points that run them: load, compile_mask, compile_all.

    source ─parse→ SourceFile ─resolve→ ResolvedMask ─normalize→ NormalMask ─ranges→ RangeMask
    (values) ─bind→ BoundParams ─classify→ TileMap ─pack→ Descriptor ;  RangeMask ─predicate/schedule/emit→ CUDA

Only this module sequences the passes; each pass module knows nothing of the others' internals. The objects
users hold are :class:`~maskc.compiled.CompiledMask` and :class:`~maskc.bound.BoundMask` (re-exported here).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping

from maskc import ir
from maskc.analysis.normalize import normalize, specialize
from maskc.analysis.order import TokenOrder, image_grid
from maskc.analysis.ranges import analyze_ranges
from maskc.analysis.reorder import reorder, reorder_regions
from maskc.analysis.widths import check_static
from maskc.bound import BoundMask
from maskc.compiled import CompiledMask
from maskc.errors import MaskError
from maskc.frontend.parse import parse
from maskc.frontend.resolve import Program, resolve, resolve_all
from maskc.frontend.sources import ImportPaths, find_import, read_source, search_path

# The compile-time pipeline after resolve, in order, with why each step exists (`maskc explain` prints
# each stage). Resolve itself needs the whole program and a mask name; every later pass takes one stage.
PASSES = (
    ("resolve", "names, types and arity checked; lets and mask calls inlined", None),
    ("normalize", "a canonical union of conjunctions of linear atoms; same() made linear", normalize),
    ("ranges", "per region, the k-interval of each row as max/min bounds in q", analyze_ranges),
)

# After compile, in order: what binding a mask to sizes and values does, and how its kernel is built
# (`maskc explain` prints these too, with --seq-len for the first three).
RUN_TIME_STAGES = (
    ("bind", "lengths and parameter values checked; segments turned into boundary tables"),
    ("classify", "each tile's class from the rows' visible intervals: FULL, PARTIAL or EMPTY"),
    ("pack", "the descriptor the kernel walks: per row block, runs of visible key blocks"),
)
ORDER_STAGE = ("whether a mask over an image runs in patches of it (q, k, v gathered into the order, the mask "
               "rewritten: compile_ordered), where its tiles then hold more visible pairs")
KERNEL_STAGES = (
    ("predicate", "the mask as device code, evaluated only on PARTIAL tiles"),
    ("schedule", "tile shapes and engines for the head dim and dtype"),
    ("emit", "the CUDA source rendered from the templates"),
)


def _compile_resolved(resolved: ir.ResolvedMask) -> "CompiledMask":
    stages: list = [resolved]
    for _, _, run in PASSES[1:]:
        stages.append(run(stages[-1]))
    check_static(stages[-1])        # folded constants that 64 bits cannot hold are refused here
    return CompiledMask(*stages)


def compile_ordered(mask: CompiledMask, order: TokenOrder, constants: Mapping[str, int] | Iterable = ()
                    ) -> CompiledMask:
    """``mask`` rewritten in the coordinates of ``order`` (:mod:`maskc.analysis.reorder`) with its const parameters at
    ``constants`` (else their defaults), compiled: one twin per order and constants, kept on ``mask``. A MaskError
    says why when the mask admits no token order, or the rewrite's tiles would not be exact (the order is then not
    worth running)."""
    constants = mask.const_values(constants)
    twins = mask.__dict__.setdefault("_orders", {})
    if (order, constants) not in twins:
        twins[order, constants] = _ordered(mask, order, dict(constants))
    found = twins[order, constants]
    if isinstance(found, MaskError):
        raise found
    return found


def _ordered(mask: CompiledMask, order: TokenOrder, constants: dict[str, int]) -> CompiledMask | MaskError:
    fixed = specialize(mask.normal, constants)
    grid = image_grid(mask.resolved, fixed)
    if isinstance(grid, str):
        return MaskError(f"mask '{mask.name}' has no token order but the raster one: {grid}", mask.resolved.span)
    # The rewritten mask twice: its rules (what dense(), bind and Flex read) and its normal form, region by region
    # from the original's (a region cut only in the pieces of the positions it reads, empty and contained regions
    # dropped: the fewest regions for the kernels' predicate); both denote the original's pairs moved by the order.
    resolved = reorder(mask.resolved, order, constants)
    normal = specialize(reorder_regions(fixed, order), {})
    ranges = analyze_ranges(normal)
    inexact = next((r.inexact for r in ranges.allow + ranges.deny if r.inexact is not None), None)
    if inexact is not None:
        return MaskError(f"mask '{mask.name}' in token order {order.name} would get inexact tiles: {inexact.reason}",
                         mask.resolved.span, "the raster order stays exact; try another patch shape")
    check_static(ranges)
    return CompiledMask(resolved, normal, ranges, order=order, source=mask)


def load_program(path: str | Path, import_paths: ImportPaths = ()) -> Program:
    """A file and, transitively, the files it imports (see :mod:`maskc.frontend.sources`: relative to the importing
    file's directory or to a directory of ``import_paths``, never outside them)."""
    path = Path(path)
    return program_from_text(read_source(path), str(path), path.parent, import_paths)


def program_from_text(text: str, path: str = "<string>", base_dir: str | Path = ".",
                      import_paths: ImportPaths = (), parse_source: Callable[[str, str], ir.SourceFile] = parse,
                      skipped: list[MaskError] | None = None) -> Program:
    """Parse a main file's text and every file it imports, main file first; the main file's imports are
    looked for under ``base_dir``, then ``import_paths``. ``parse_source(text, path)`` parses each file (lint
    passes one that recovers from syntax errors); with a ``skipped`` list, an import that cannot be found, read
    or parsed is left out and its error appended there instead of raised (lint goes on with the rest)."""
    search = search_path(import_paths)
    main = parse_source(text, path)
    files = [main]
    seen = {Path(path).resolve(): path} if path != "<string>" else {}
    edges: dict[str, list[str]] = {}         # what each file's import lines found: whose masks it sees

    def visit(f: ir.SourceFile, here: Path):
        found = edges.setdefault(f.path, [])
        for imp in f.imports:
            try:
                p = find_import(imp, here, search)
                if p in seen:
                    found.append(seen[p])
                    continue
                seen[p] = str(p)
                imported = parse_source(read_source(p, imp.span, regular_only=True), str(p))
            except MaskError as err:
                if skipped is None:
                    raise
                skipped.append(err)
                continue
            found.append(imported.path)
            files.append(imported)
            visit(imported, p.parent)

    visit(main, Path(base_dir))
    return Program(tuple(files), tuple((f, tuple(to)) for f, to in edges.items()))


def compile_program(program: Program, name: str | None = None) -> CompiledMask:
    return _compile_resolved(resolve(program, name))


def compile_mask(text: str, name: str | None = None, path: str = "<string>", base_dir=".",
                 import_paths: ImportPaths = ()) -> CompiledMask:
    """Compile .mask source text; ``name`` picks a mask when the text defines several. Its imports are
    looked for under ``base_dir``, then under the directories ``import_paths``, never outside them."""
    if not isinstance(text, str):       # bytes failed deep in the parser, saying a str was not bytes
        raise TypeError(f"compile_mask() takes the text of a .mask file as a str, not {type(text).__name__}"
                        + (" (decode it, or give the file to maskc.load)" if isinstance(text, (bytes, bytearray))
                           else ""))
    return compile_program(program_from_text(text, path, base_dir, import_paths), name)


def load(path: str | Path, name: str | None = None, import_paths: ImportPaths = ()) -> CompiledMask:
    """Compile a .mask file; ``name`` picks a mask when the file defines several. Its imports are looked
    for under its directory, then under the directories ``import_paths``, never outside them."""
    return compile_program(load_program(path, import_paths), name)


def compile_all(path: str | Path, import_paths: ImportPaths = ()) -> tuple[CompiledMask, ...]:
    return tuple(_compile_resolved(r) for r in resolve_all(load_program(path, import_paths)))


__all__ = ["CompiledMask", "BoundMask", "compile_mask", "load", "compile_all", "load_program", "compile_ordered",
           "MaskError"]
