"""The compiler as a list of passes, and the objects users hold: CompiledMask and BoundMask.

    source ─parse→ SourceFile ─resolve→ ResolvedMask ─normalize→ NormalMask ─ranges→ RangeMask
    (values) ─bind→ BoundParams ─classify→ TileMap ─pack→ Descriptor ;  RangeMask ─predicate/schedule/emit→ CUDA

Only this module sequences the passes; each pass module knows nothing of the others' internals.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Union

import numpy as np

from maskc import ir
from maskc.analysis.bind import bind as bind_params
from maskc.analysis.bind import check_blocks, check_constants, check_index
from maskc.analysis.classify import classify
from maskc.analysis.descriptor import check_size, pack, to_flex_block_mask_arrays
from maskc.analysis.evaluate import dense_mask
from maskc.analysis.normalize import normalize, specialize
from maskc.analysis.score import modified_scores
from maskc.analysis.score import reads_head as score_reads_head
from maskc.analysis.ranges import analyze_ranges
from maskc.analysis.widths import check_static
from maskc.codegen.predicate import pack_mask_data, predicate
from maskc.codegen.score import score_code
from maskc.errors import BindError, MaskError, MaskSyntaxError
from maskc.frontend.parse import parse
from maskc.frontend.resolve import Program, resolve, resolve_all
from maskc.frontend.sources import find_import, read_source, search_path
from maskc.kernel_ir import (MAX_DESCRIPTOR_BYTES, BackwardSpec, BoundParams, Descriptor, KernelSource, KernelSpec,
                             TileMap)
from maskc.options import DEFAULT, Options
from maskc.runtime import handles

if TYPE_CHECKING:
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    from maskc.flex import FlexMaskMod, FlexScoreMod
    from maskc.restrict import RestrictedMask

Device = Union[str, "torch.device", None]

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


def load_program(path: str | Path, import_paths: Iterable[str | Path] = ()) -> Program:
    """A file and, transitively, the files it imports (see :mod:`maskc.frontend.sources`: relative to the importing
    file's directory or to a directory of ``import_paths``, never outside them)."""
    path = Path(path)
    return program_from_text(read_source(path), str(path), path.parent, import_paths)


def program_from_text(text: str, path: str = "<string>", base_dir: str | Path = ".",
                      import_paths: Iterable[str | Path] = ()) -> Program:
    """Parse a main file's text and every file it imports, main file first; the main file's imports are
    looked for under ``base_dir``, then ``import_paths``."""
    search = search_path(import_paths)
    main = parse(text, path)
    files = [main]
    seen = {Path(path).resolve()} if path != "<string>" else set()

    def visit(f: ir.SourceFile, here: Path):
        for imp in f.imports:
            p = find_import(imp, here, search)
            if p in seen:
                continue
            seen.add(p)
            imported = parse(read_source(p, imp.span, regular_only=True), str(p))
            files.append(imported)
            visit(imported, p.parent)

    visit(main, Path(base_dir))
    return Program(tuple(files))


@dataclass(frozen=True, eq=False)
class CompiledMask:
    """A mask taken through every compile-time pass; ``bind`` it to lengths and parameter values."""

    resolved: ir.ResolvedMask
    normal: ir.NormalMask
    ranges: ir.RangeMask
    # Kernels of a sub-block (BoundMask.restrict): positions local to it, its origin read from the table.
    offsets: bool = False

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
            twin = CompiledMask(self.resolved, self.normal, self.ranges, offsets=True)
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

    def bind(self, seq_len: int, kv_len: int | None = None, num_heads: int | None = None,
             **params) -> "BoundMask":
        return BoundMask(self, bind_params(self.resolved, self.ranges, seq_len, kv_len, num_heads, **params))

    @property
    def const_params(self) -> tuple[str, ...]:
        """Int parameters declared ``const``: their values are compiled into the kernel."""
        return tuple(p.name for p in self.params if p.const)

    def kernel_spec(self, head_dim: int = 128, dtype: str = "bf16", block_m: int | None = None,
                    block_n: int | None = None, num_warps: int | None = None,
                    constants: tuple[tuple[str, int], ...] = (), engine: str | None = None,
                    arch: str = "sm_90a", narrow: bool = False) -> KernelSpec:
        """The kernel's spec for a target ``arch`` (maskc.codegen.schedule.ARCHES; default an H100/H200); a mask with
        const parameters takes their ``constants`` (a bound mask's), else the defaults its file declares
        (:meth:`const_values`). Tiles and engine not given come from the schedule for that target.
        ``narrow``: the predicate in 32 bits, for a binding that proved it enough (``BoundParams.narrow``)."""
        from maskc.codegen.schedule import capability_of, choose_tiles

        if block_m is None or block_n is None or num_warps is None or engine is None:
            chosen = choose_tiles(head_dim, dtype, capability_of(arch), engine=engine,
                                  table_regions=self.table_regions)
            block_m, block_n = block_m or chosen.block_m, block_n or chosen.block_n
            num_warps, engine = num_warps or chosen.num_warps, engine or chosen.engine
        constants = self.const_values(constants)
        return KernelSpec(self._c_name(), head_dim, dtype, block_m, block_n, num_warps,
                          predicate(self.ranges, tuple(constants), self.offsets, narrow), self._summary(constants),
                          engine, arch, score_code(self.resolved, tuple(constants), self.offsets))

    def backward_spec(self, head_dim: int = 128, dtype: str = "bf16",
                      constants: tuple[tuple[str, int], ...] = (), engine: str | None = None,
                      arch: str = "sm_90a", dq_reduction: str | None = None, narrow: bool = False) -> BackwardSpec:
        """The backward kernels' spec for a target ``arch`` (tiles and dK/dV engine from the schedule;
        ``engine`` picks one; ``dq_reduction`` the wgmma kernel's, else the default); const parameters and
        ``narrow`` as for kernel_spec."""
        from maskc.codegen.schedule import capability_of, choose_backward_tiles, choose_dq_reduction

        constants = self.const_values(constants)
        tiles = choose_backward_tiles(head_dim, dtype, capability_of(arch), engine=engine)
        return BackwardSpec(self._c_name(), head_dim, dtype, tiles.block_m, tiles.block_n,
                            tiles.dq_block_n, predicate(self.ranges, tuple(constants), self.offsets, narrow),
                            self._summary(constants), tiles.engine, choose_dq_reduction(tiles.engine, dq_reduction),
                            arch, score_code(self.resolved, tuple(constants), self.offsets))

    def _c_name(self) -> str:
        from maskc.codegen.sanitize import c_identifier
        return c_identifier(self.name) + ("_sub" if self.offsets else "")

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
        return tuple(_summary_lines(self.resolved)) + tuple(f"const {n} = {v}" for n, v in constants) + sub

    def kernel_source(self, options: Options = DEFAULT, **kwargs) -> KernelSource:
        """The forward kernel's CUDA: :meth:`kernel_spec` of ``kwargs`` (engine and target, where they give
        none, those of ``options``), rendered with the switches of ``options``."""
        from maskc.codegen.emit import emit_kernel
        kwargs["engine"] = kwargs.get("engine") or options.engine
        kwargs["arch"] = kwargs.get("arch") or options.arch or "sm_90a"
        return emit_kernel(self.kernel_spec(**kwargs), options)

    def backward_source(self, options: Options = DEFAULT, **kwargs) -> KernelSource:
        """The backward kernels' CUDA: :meth:`backward_spec` of ``kwargs`` (engine, target and dQ reduction,
        where they give none, those of ``options``)."""
        from maskc.codegen.emit import emit_backward_kernel
        kwargs["engine"] = kwargs.get("engine") or options.backward_engine
        kwargs["arch"] = kwargs.get("arch") or options.arch or "sm_90a"
        kwargs["dq_reduction"] = kwargs.get("dq_reduction") or options.dq_reduction
        return emit_backward_kernel(self.backward_spec(**kwargs))


def _param_repr(p: ir.Param) -> str:
    from maskc.explain import expr_text
    sizes = "" if p.shape is None else f"[{', '.join(expr_text(e) for e in p.shape)}]"
    table = ("table" if p.of is None else f"per {p.of}" + (" table" if p.dims else "")) + sizes
    kind = {"int": "const int" if p.const else "int", "segments": "segments over k" if p.over == "k" else "segments",
            "per": f"per {p.of}", "table": table,
            "float": "float", "float_table": "float table" if p.of is None else f"float per {p.of}"}[p.kind]
    return f"{p.name}: {kind}" + (f" = {p.default}" if p.default is not None else "")


def _values_repr(element) -> str:
    """One batch element's values, long segment lists cut short: ``docs=[1000, 3000, 96]``."""
    def short(values) -> str:
        items = [int(v) for v in values]
        return str(items) if len(items) <= 6 else f"[{', '.join(map(str, items[:5]))}, ... ({len(items)} values)]"
    out = [f"{n}={v}" for n, v in element.ints]
    for n, table in element.segments:
        out.append(f"{n}={short(np.diff(table.bounds))}")
        out += [f"{a}={short(v)}" for a, v in table.values]
    out += [f"{n}={short(table.values)}" for n, table in element.tables]
    out += [f"{n}={v:g}" if isinstance(v, float) else f"{n}=[{', '.join(f'{x:g}' for x in v[:5])}"
            f"{', ...' if len(v) > 5 else ''}]" for n, v in element.floats]
    return ", ".join(out)


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


@dataclass(frozen=True, eq=False)
class BoundMask:
    """A compiled mask with lengths and parameter values. Everything on the way to a descriptor grows with the
    sequence and the runs of visible tiles, never with the tile grid (only ``tiles()``, ``dense()`` and
    ``to_flex_block_mask()``, which return dense arrays, build them)."""

    mask: CompiledMask
    params: BoundParams

    def __post_init__(self):
        # An int that names this object where only numbers may pass (torch custom ops: maskc.runtime.torch_ops).
        object.__setattr__(self, "handle", handles.register(self))
        object.__setattr__(self, "handle_array", handles.as_array(self.handle))   # the same, as data

    def __repr__(self) -> str:
        shown = [f"seq_len={self.seq_len}"] + ([f"kv_len={self.kv_len}"] if self.kv_len != self.seq_len else [])
        shown += [f"num_heads={self.num_heads}"] if self.num_heads else []
        values = [_values_repr(e) for e in self.params.batch[:3]]
        batch = values[0] if self.batch == 1 else "; ".join(values) + ("; ..." if self.batch > 3 else "")
        return (f"BoundMask({self.mask.name}: {', '.join(shown)}" + (f", batch={self.batch}" if self.batch > 1 else "")
                + (f", {batch}" if batch else "") + ")")

    @property
    def seq_len(self) -> int:
        return self.params.seq_len

    @property
    def kv_len(self) -> int:
        return self.params.kv_len

    @property
    def batch(self) -> int:
        return len(self.params.batch)

    @property
    def num_heads(self) -> int | None:
        return self.params.num_heads

    def dense(self, batch_index: int = 0, head: int = 0) -> np.ndarray:
        """bool[seq_len, kv_len], by brute force: for tests and small sizes."""
        batch_index = check_index(batch_index, "batch_index", self.batch)
        head = check_index(head, "head", self.num_heads)
        return dense_mask(self.mask.resolved, self.params.batch[batch_index], self.seq_len, self.kv_len,
                          head, batch_index)

    def modified_scores(self, scores: np.ndarray, batch_index: int = 0, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(mod(scores), mod'(scores)): the score modifier and its derivative on dense float64 scaled scores
        [seq_len, kv_len] of one batch element and head (the scores and ones without a modifier)."""
        return modified_scores(self.mask.resolved, self.params.batch[batch_index], self.seq_len, self.kv_len, head,
                               batch_index, scores, range(self.seq_len), range(self.kv_len))

    def tile_map(self, block_m: int = 128, block_n: int = 128, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> TileMap:
        """Every batch element's tile classes as run-length rows: memory grows with the runs, never with the
        tile grid; more than ``max_bytes`` of them is a BindError (raise the cap for very long sequences)."""
        return _tile_map(self, block_m, block_n, max_bytes)

    def tiles(self, block_m: int = 128, block_n: int = 128) -> np.ndarray:
        """int8[ceil(S/block_m), ceil(K/block_n)]: 0 EMPTY, 1 PARTIAL, 2 FULL (batch element 0;
        ``tile_map().classes`` has every batch element). A dense grid, for those who ask: the descriptor never
        builds it."""
        return self.tile_map(block_m, block_n).classes[0]

    def descriptor(self, block_m: int = 128, block_n: int = 128, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> Descriptor:
        """The kernels' descriptor for these tiles (cached per tile shape): its bytes grow with the runs, at
        most ``max_bytes`` (default 1 GiB), else a BindError before or while it is built."""
        return _descriptor(self, block_m, block_n, max_bytes)

    def restrict(self, q_range, kv_range) -> "RestrictedMask":
        """The sub-block of query rows ``q_range`` and keys ``kv_range`` (``(start, stop)`` pairs or
        ``range``s of step 1) as a bound mask of its own: attention over a slice of q and of k/v, with
        local positions (context parallelism: :mod:`maskc.distributed`). See :mod:`maskc.restrict`."""
        from maskc.restrict import RestrictedMask
        return RestrictedMask.of(self, q_range, kv_range)

    def to_flex_block_mask(self, block_size: int | tuple[int, int] = 128, device: Device = None) -> "BlockMask":
        """maskc's tile classes as a ``torch.nn.attention.flex_attention.BlockMask`` on ``device`` (default:
        the CPU; ``.to("cuda")`` moves it), with :meth:`flex_mask_mod` for its PARTIAL blocks: feed it
        straight to ``flex_attention``, or to ``maskc.attention``. ``block_size``: one side, or (query, key)."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask

        block_m, block_n = (block_size, block_size) if isinstance(block_size, int) else block_size
        device = device or "cpu"
        arrays = to_flex_block_mask_arrays(self.tile_map(block_m, block_n))
        t = {k: torch.from_numpy(v).to(device) for k, v in arrays.items()}
        return BlockMask.from_kv_blocks(t["kv_num_blocks"], t["kv_indices"], t["full_kv_num_blocks"],
                                        t["full_kv_indices"], BLOCK_SIZE=(block_m, block_n),
                                        mask_mod=self.flex_mask_mod(device),
                                        seq_lengths=(self.seq_len, self.kv_len))

    def flex_score_mod(self, device: Device = None) -> "FlexScoreMod | None":
        """The mask's score modifier as Flex's ``score_mod`` ``(score, b, h, q_idx, kv_idx)`` (None when the mask
        has none); its tables on ``device`` (default the CPU), following the positions it is called with."""
        from maskc.flex import FlexScoreMod
        return None if self.mask.resolved.score is None else FlexScoreMod(self, device)

    def flex_mask_mod(self, device: Device = None) -> "FlexMaskMod":
        """The mask as a FlexAttention mask_mod in torch operations (O(N) tables, any length), its tables on
        ``device`` (default: the CPU; they follow the positions it is called with to theirs)."""
        from maskc.flex import FlexMaskMod
        return FlexMaskMod(self, device)

    def visible_pairs(self) -> int:
        """The number of visible (q, k) pairs summed over the batch (and the heads of a mask that reads h), never
        with the dense mask: from the row intervals for exact masks, else pair by pair one query block at a
        time."""
        if self.mask.exact:
            from maskc.analysis.classify import visible_pairs
            from maskc.analysis.keys import TooMany
            try:
                return visible_pairs(self.mask.ranges, self.params)
            except TooMany:
                pass
        from maskc.audit import count_visible_pairs
        return count_visible_pairs(self)

    @property
    def constants(self) -> tuple[tuple[str, int], ...]:
        """The values this bind gives the mask's const parameters (part of the kernel's identity)."""
        return self.params.constants(self.mask.const_params)

    def kernel_spec(self, **kwargs) -> KernelSpec:
        """The mask's kernel_spec for this binding: its const values, and the 32-bit predicate where bind
        proved it enough."""
        return self.mask.kernel_spec(constants=self.constants, narrow=self.narrow, **kwargs)

    def backward_spec(self, **kwargs) -> BackwardSpec:
        return self.mask.backward_spec(constants=self.constants, narrow=self.narrow, **kwargs)

    @property
    def narrow(self) -> bool:
        """Whether this binding's kernels compute the predicate in 32 bits (bind proved it enough)."""
        return self.params.narrow


def _tile_map(bound: "BoundMask", block_m: int, block_n: int, max_bytes: int) -> TileMap:
    block_m, block_n = check_blocks(block_m, block_n)
    cache = bound.__dict__.setdefault("_tile_maps", {})      # lives and dies with the bound mask
    if (block_m, block_n) not in cache:
        per_element = [bound.mask.specialized(e.ints) for e in bound.params.batch]
        cache[block_m, block_n] = classify(per_element, bound.params, block_m, block_n, max_bytes)
    else:
        check_size(cache[block_m, block_n], max_bytes)
    return cache[block_m, block_n]


def _descriptor(bound: "BoundMask", block_m: int, block_n: int, max_bytes: int) -> Descriptor:
    block_m, block_n = check_blocks(block_m, block_n)
    cache = bound.__dict__.setdefault("_descriptors", {})
    if (block_m, block_n) not in cache:
        data, offsets = pack_mask_data(bound.mask.ranges, bound.params)
        cache[block_m, block_n] = pack(_tile_map(bound, block_m, block_n, max_bytes), data, offsets, max_bytes)
    else:
        check_size(cache[block_m, block_n], max_bytes)
    return cache[block_m, block_n]


def compile_program(program: Program, name: str | None = None) -> CompiledMask:
    return _compile_resolved(resolve(program, name))


def compile_mask(text: str, name: str | None = None, path: str = "<string>", base_dir=".",
                 import_paths: Iterable[str | Path] = ()) -> CompiledMask:
    """Compile .mask source text; ``name`` picks a mask when the text defines several. Its imports are
    looked for under ``base_dir``, then under the directories ``import_paths``, never outside them."""
    return compile_program(program_from_text(text, path, base_dir, import_paths), name)


def load(path: str | Path, name: str | None = None, import_paths: Iterable[str | Path] = ()) -> CompiledMask:
    """Compile a .mask file; ``name`` picks a mask when the file defines several. Its imports are looked
    for under its directory, then under the directories ``import_paths``, never outside them."""
    return compile_program(load_program(path, import_paths), name)


def compile_all(path: str | Path, import_paths: Iterable[str | Path] = ()) -> tuple[CompiledMask, ...]:
    return tuple(_compile_resolved(r) for r in resolve_all(load_program(path, import_paths)))


__all__ = ["CompiledMask", "BoundMask", "compile_mask", "load", "compile_all", "load_program", "MaskError"]
