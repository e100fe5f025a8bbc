"""The kernels' plans: one frozen value that decides a source's kernels, read by the template (constants, shared
memory layout, the signature), by the runtime (block size, shared memory, argument packing by name) and by
the cache (the rendered source is a function of the plan alone).

    spec (mask, head dim, dtype, tiles, engine) + switches ─plan_forward→ ForwardPlan ─emit→ CUDA
    backward spec ─plan_backward→ BackwardPlan ─emit→ CUDA

``plan_forward`` is pure; it makes every choice that used to be scattered between the emitter, the template
and the runtime: the interval table, the K/V stages, where O is staged, the register split of the
warp-specialized kernel, whether the pipeline overlaps, and the ordered list of kernel parameters.
``plan_backward`` is pure too: the dK/dV kernel's template, block size, register split and shared-memory layout,
and the dQ kernel's layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from maskc.codegen.tile_bits import ROOT_ENTRIES
from maskc.kernel_ir import BackwardSpec, Descriptor, KernelSpec

KV_STAGES = 2            # wgmma_tma: shared-memory stages of K and V
SMEM_LIMIT = 227 * 1024  # dynamic shared memory one CTA may have on sm_90


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name (the runtime sets arguments by it) and C declaration type."""

    name: str
    ctype: str

    @property
    def declaration(self) -> str:
        return f"{self.ctype} {self.name}"


def _params(text: str) -> tuple[Param, ...]:
    out = []
    for decl in (d.strip() for d in text.split(",")):
        ctype, _, name = decl.rpartition(" ")
        out.append(Param(name, ctype))
    return tuple(out)


# Every forward kernel's parameters, in order. q, k, v, o: (B, H, S, D) 16-bit data; lse [B, Hq, S] float32 or
# null; element strides (batch, head, row), the last dim contiguous; the descriptor's arrays (kernel_ir). A score
# modifier's float parameters travel in mask_data as their bits (maskc.codegen.predicate.pack_mask_data), so a
# modifier adds no parameter and a mask without one has the signature it always had.
COMMON_PARAMS = _params(
    "const unsigned short* __restrict__ q, const unsigned short* __restrict__ k, "
    "const unsigned short* __restrict__ v, unsigned short* __restrict__ o, float* __restrict__ lse, "
    "long long q_sb, long long q_sh, long long q_ss, long long k_sb, long long k_sh, long long k_ss, "
    "long long v_sb, long long v_sh, long long v_ss, long long o_sb, long long o_sh, long long o_ss, "
    "int num_heads, int num_kv_heads, int seq_len, int kv_len, int mask_batch, "
    "const int* __restrict__ run_offsets, const int* __restrict__ runs, const int* __restrict__ work_order, "
    "const int* __restrict__ mask_data, const int* __restrict__ mask_offsets, float scale_log2")
# The warp-specialized kernel's: tensor maps of q, k, v (by value), the data's batch elements per mask batch
# element, the work order's length, heads per L2 section, the row blocks taken for every head before the sections
# (maskc.runs.front_rows), and the work counter (int[2], per stream).
TMA_PARAMS = _params(
    "const __grid_constant__ maskc::TensorMap q_map, const __grid_constant__ maskc::TensorMap k_map, "
    "const __grid_constant__ maskc::TensorMap v_map, int batch_grid, int n_work, int l2_heads, int front_rows, "
    "int* __restrict__ schedule")
# The stored path's (ForwardPlan.stored): the row view's number of each run's first PARTIAL tile
# (Descriptor.partial_slots) and the PARTIAL tiles' visibility words, STORED_WORDS per row, in that order.
STORED_PARAMS = _params("const int* __restrict__ run_slots, const unsigned* __restrict__ tile_words")
# The words of one row of a PARTIAL tile on the stored path: one per thread of a quad (column 8 nt + 2 t + e of
# the tile is bit 2 nt + e of word t), so BLOCK_N is at most 128.
STORED_WORDS = 4
# The stored path's builders' parameters (KernelSpec.entry_tile_words, BackwardSpec.entry_tile_words): each slot's
# tile (row block and key block, or column block and query block), their number, the mask's tables, the lengths,
# and the words they write.
TILE_WORDS_PARAMS = _params(
    "const int* __restrict__ tiles, int n_tiles, const int* __restrict__ mask_data, "
    "const int* __restrict__ mask_offsets, int seq_len, int kv_len, unsigned* __restrict__ tile_words")
# Per-call arguments: data pointers (and, for wgmma_tma, the tensor maps that hold them and the stream's counter).
POINTERS = ("q", "k", "v", "o", "lse")
TENSOR_MAPS = ("q_map", "k_map", "v_map")


# The softmax against a fixed maximum (ForwardPlan.fixed_max). Scores that a modifier bounds (softcap's: in units
# of score_unit they are t = tanh(.), |t| < 1) enter the exponent as x = t * K with K = cap * log2(e), and
# P = exp2(x - FIXED_EXPONENT) lies between 2**P_LOW and 2**P_HIGH for every score when K <= FIXED_MAX_K: a normal
# float (ex2.approx flushes subnormals to 0, which would drop the weights of a row whose scores are all small), and
# at most 2**20 times the largest value a dynamic maximum allows, which the output's fp32 sums of P * v keep.
P_LOW, P_HIGH = -126, 20
FIXED_EXPONENT = -(P_LOW + P_HIGH) / 2           # 53: the exponent subtracted from every score's
FIXED_MAX_K = (P_HIGH - P_LOW) / 2               # 73
FIXED_MAX_CAP = FIXED_MAX_K / math.log2(math.e)  # 50.6: Gemma 2's 50 and Grok-1's 30 fit


@dataclass(frozen=True)
class ForwardPlan:
    """Every decision of one forward kernel (see the module docstring)."""

    spec: KernelSpec
    template: str
    interval_regions: tuple[int, int] | None   # (allow, deny) regions of the interval table, or per-pair masking
    params: tuple[Param, ...]
    shared_bytes: int
    kv_stages: int = KV_STAGES
    o_in_q_buffer: bool = False                # wgmma_tma: O staged in Q's buffer (D=256)
    registers: tuple[int, int] = (0, 0)        # wgmma_tma: (producer, consumer) per thread after setmaxnreg
    overlap: bool = False                      # wgmma_tma: S of tile j+1 overlaps P V of tile j
    pingpong: bool = False                     # wgmma_tma: consumer warpgroups take turns issuing products
    debug_waits: bool = False                  # wgmma_tma: reporting barrier waits (finding hangs)
    root_tables: int = 0                       # wgmma_tma tile path: root tables per consumer warp (root_tables)
    # how PARTIAL tiles of an exact chunked mask are masked (wgmma_tma): "bits" (mask_bits per row and tile,
    # maskc.codegen.tile_bits), "elements" (the raster mask's test per pair, maskc.codegen.elements) or "stored"
    # (each tile's words read, built by the source's second entry once per binding); "" for every other kernel
    # (the interval table, or mask_visible per pair)
    partial_tiles: str = ""
    # wgmma_tma: 1 column tile of the softmax in this many takes exp2 on the FMA pipe (Options.exp2_emulation)
    exp2_emulation: int = 0
    # wgmma_tma: the softmax against a fixed maximum (FIXED_EXPONENT above): no row maxima, the output never
    # rescaled; where the binding's scores are bounded for it (spec.fixed_max) and P passes to P V in bf16, whose
    # range is fp32's (fp16's is not)
    fixed_max: bool = False
    # wgmma_tma, online softmax: a row's running maximum moves only when a tile raises it by more than
    # RESCALE_THRESHOLD (forward_tile.cu.j2), and a warp skips rescaling O while none of its rows moved. Off for
    # score modifiers: ALiBi's kernel took more cycles with it, walking its tiles forwards (its maxima move on most
    # tiles: +2.8%, session 18) and backwards from the diagonal (8% fewer instructions, +1.7% cycles, run 103)
    # (bench/NOTES.md; causal -2.8% cycles).
    lazy_rescale: bool = False

    @property
    def threads(self) -> int:
        return self.spec.threads

    @property
    def fixed_exponent(self) -> float:
        """The exponent the fixed maximum subtracts (FIXED_EXPONENT), for the template."""
        return FIXED_EXPONENT

    @property
    def score(self):
        """The score modifier's device code (``spec.score``, None without one): part of the plan, hence of the
        rendered source and of the kernel cache key (a hash of the source)."""
        return self.spec.score

    @property
    def iv(self) -> dict | None:
        """The interval table's regions as the templates read them."""
        if self.interval_regions is None:
            return None
        return {"allow": self.interval_regions[0], "deny": self.interval_regions[1]}

    @property
    def tile_bits(self) -> bool:
        """PARTIAL tiles masked through the predicate's mask_bits, per row and tile (exact masks with chunked
        regions; the wgmma_tma kernel, whose shared tile code has the path), not per key."""
        return self.partial_tiles == "bits"

    @property
    def stored(self) -> bool:
        """PARTIAL tiles masked by visibility words read per tile (STORED_WORDS per row), which the source's
        builder (``spec.entry_tile_words``, TILE_WORDS_PARAMS) computes through mask_bits once per binding:
        the mask is evaluated once per tile, not once per tile and head."""
        return self.partial_tiles == "stored"

    @property
    def stored_words(self) -> int:
        """The words of one row of a PARTIAL tile on the stored path (STORED_WORDS), for the template."""
        return STORED_WORDS

    @property
    def tile_words_params(self) -> tuple[Param, ...]:
        """The stored path's builder's parameters, in order (TILE_WORDS_PARAMS)."""
        return TILE_WORDS_PARAMS

    @property
    def entries(self) -> tuple[str, ...]:
        """The source's kernels: the forward, and the stored path's builder of visibility words."""
        return (self.spec.entry, self.spec.entry_tile_words) if self.stored else (self.spec.entry,)

    @property
    def elements(self) -> bool:
        """PARTIAL tiles masked through the element path (the predicate's ``elements``: row values once per row,
        key-column values once per column, the raster mask's test per pair)."""
        return self.partial_tiles == "elements"

    @property
    def root_table_ints(self) -> int:
        """The ints of one warp's root tables."""
        return self.root_tables * ROOT_ENTRIES

    @property
    def wgmma_widths(self) -> tuple[int, ...]:
        """The N of every wgmma product the kernel issues (S: BLOCK_N, O: HEAD_DIM)."""
        return tuple(sorted({self.spec.block_n, self.spec.head_dim}))


def stored_bytes(desc: Descriptor, transposed: bool = False) -> int:
    """The bytes of the stored path's visibility words for ``desc``'s row view (the forward: STORED_WORDS per row
    of a PARTIAL tile) or, ``transposed``, its column view (the dK/dV kernel: a bit per pair)."""
    row_bytes = desc.block_n // 8 if transposed else STORED_WORDS * 4
    return desc.tile_map.counts()["PARTIAL"] * desc.block_m * row_bytes


def tma_registers(spec: KernelSpec) -> tuple[int, int]:
    """wgmma_tma's (producer, consumer) registers per thread after setmaxnreg, the fewest spills ptxas
    reported among the splits of the register file tried (NVRTC 13.0): two warpgroups 56 / 224 (no spills at
    D <= 128; when chosen the producer spilled below 56, and today's kernels compile without spills at FA3's
    24 / 240 too, which run 85 measured 1.0-3.9% slower than 56 / 224: bench/NOTES.md session 16), 24 / 240
    at D = 256 (the consumers spill 8-64 bytes: O alone takes 128 registers); three warpgroups 32 / 160 (D = 64:
    0-12 bytes)."""
    if spec.num_warps == 12:
        return 32, 160
    return (24, 240) if spec.head_dim == 256 else (56, 224)


def interval_regions(spec: KernelSpec) -> tuple[int, int] | None:
    """(allow, deny) regions of the interval table the forward kernel keeps, or None: the predicate is then
    called per pair on PARTIAL tiles (masks with per-key atoms; the mma kernel at block_n > 64, which keeps
    one 64-bit visibility word per row and tile)."""
    regions = spec.predicate.interval_regions
    if regions is None or (spec.engine == "mma" and spec.block_n > 64):
        return None
    return regions["allow"], regions["deny"]


def partial_tiles(spec: KernelSpec, regions: tuple[int, int] | None, choice: str = "auto") -> str:
    """How the kernel masks PARTIAL tiles of an exact mask with chunked regions, per ``choice``
    (maskc.options.Options.partial_tiles; Predicate.partial_path): "stored" (words read per tile; "auto"'s
    choice where the mask does not read h), "bits" (the tile path), "elements" (the element path); "" where
    none applies (an interval table, per-key atoms, the mma kernel)."""
    if not (regions is None and spec.engine == "wgmma_tma"):
        return ""
    return spec.predicate.partial_path(choice, stored=spec.block_n <= 8 * 4 * STORED_WORDS)


def root_tables(spec: KernelSpec, partial: str) -> int:
    """The root tables (maskc.codegen.tile_bits) each consumer warp of the tile path keeps in shared memory,
    filled once per work item, so that PARTIAL tiles read the chunk nests' roots: 0 without the tile path
    (``partial``, :func:`partial_tiles`) or roots to table."""
    return spec.predicate.root_tables if partial == "bits" else 0


def shared_bytes(spec: KernelSpec, regions: tuple[int, int] | None, roots: int = 0) -> int:
    """Dynamic shared memory of one CTA (the template static_asserts the same sum), with ``roots`` root tables
    per consumer warp."""
    table = 0 if regions is None else sum(regions) * spec.block_m * 8   # int2 [region][row]
    table += roots * ROOT_ENTRIES * 4 * spec.num_warps                  # int [warp][table][entry]
    tile = lambda rows: 2 * rows * spec.head_dim   # noqa: E731  (16-bit elements)
    if spec.engine == "wgmma_tma":
        q_and_o = tile(spec.block_m) * (1 if spec.head_dim == 256 else 2)
        # mbarriers, the work-item mailbox and a word per consumer warp (the softmax's sink)
        barriers = 8 * (2 + 4 * KV_STAGES) + 8 + 4 * spec.num_warps
        return q_and_o + 2 * KV_STAGES * tile(spec.block_n) + barriers + table + 1024   # + alignment slack
    return tile(spec.block_m) + 4 * tile(spec.block_n) + table      # Q, two stages of K and V


def plan_forward(spec: KernelSpec, overlap: bool = True, pingpong: bool = True,
                 debug_waits: bool = False, partial: str = "auto", exp2_emulation: int = 0) -> ForwardPlan:
    """The plan of ``spec``'s forward kernel; the switches are experiments' (maskc.options.Options: overlap,
    pingpong, debug_waits, exp2_emulation, which the mma kernel ignores; the defaults are the product),
    ``partial`` the masking of PARTIAL tiles asked for (Options.partial_tiles, :func:`partial_tiles`)."""
    regions = interval_regions(spec)
    partial = partial_tiles(spec, regions, partial)
    roots = root_tables(spec, partial)
    if shared_bytes(spec, regions, roots) > SMEM_LIMIT:
        roots = 0           # the chunk nests compute their roots (mask_bits without tables): same bits, slower
    smem = shared_bytes(spec, regions, roots)
    if smem > SMEM_LIMIT:
        raise ValueError(f"{spec.engine}: tiles {spec.block_m}x{spec.block_n} at head dim {spec.head_dim} need "
                         f"{smem} bytes of shared memory ({SMEM_LIMIT} per CTA)")
    if spec.engine == "mma":
        return ForwardPlan(spec, "attention_fwd.cu.j2", regions, COMMON_PARAMS, smem)
    # The overlapped pipeline keeps S, P and O live at once; a predicate evaluated per pair (no interval
    # table) then spills (84 B for clear at D=128), so such masks get the plain loop, but for two warpgroups
    # at D=64 where registers allow, and on the stored path (its masking holds two words a thread).
    overlap = overlap and (regions is not None or partial == "stored" or (spec.head_dim <= 64 and spec.num_warps == 8))
    fixed_max = spec.fixed_max and spec.dtype == "bf16" and not exp2_emulation
    assert not fixed_max or (spec.score is not None and spec.score.unit), "a fixed maximum needs softcap's unit"
    params = COMMON_PARAMS + TMA_PARAMS + (STORED_PARAMS if partial == "stored" else ())
    return ForwardPlan(spec, "attention_fwd_tma.cu.j2", regions, params, smem,
                       o_in_q_buffer=spec.head_dim == 256, registers=tma_registers(spec), overlap=overlap,
                       pingpong=pingpong, debug_waits=debug_waits, root_tables=roots, partial_tiles=partial,
                       exp2_emulation=exp2_emulation, fixed_max=fixed_max,
                       lazy_rescale=spec.score is None)


def _placed(sizes: dict[str, int], align: int = 128, tight: tuple[str, ...] = ()) -> dict[str, int]:
    """Byte offsets of consecutive buffers, each aligned to ``align`` (those named in ``tight`` to 128 bytes
    only); ``total`` is the bytes used."""
    out, at = {}, 0
    for name, size in sizes.items():
        step = 128 if name in tight else align
        out[name] = at = -(-at // step) * step
        at += -(-size // step) * step
    out["total"] = at
    return out


def backward_layout(spec: BackwardSpec) -> dict[str, dict[str, int]]:
    """Shared-memory layout of the two main backward kernels (byte offsets and ``total``), the one
    source of truth for the template's constants and the runtime's launch size.

    dK/dV: this CTA's K and V tiles, two stages of Q and dO, the dS^T tile (block_n x block_m, for dQ),
    two stages of LSE and delta, and one PARTIAL tile's visibility bits (dkdv_bits_stages); where the
    warpgroups split the head dim, P^T tiles as dS^T's. dQ: Q and dO, two stages of K and V, visibility
    bits. Both: the root tables of a mask whose chunk nests read some."""
    d, bm, bn, dbn = spec.head_dim, spec.block_m, spec.block_n, spec.dq_block_n
    tile = lambda rows: rows * d * 2   # noqa: E731  (16-bit elements)
    hopper = spec.engine in ("wgmma", "wgmma_tma")
    # wgmma reads its tiles at the 1024-byte swizzle atom: aligned buffers, plus slack to align the base; the
    # warp-specialized kernel double-buffers dS^T and the bits too (its warps drift apart by up to a step)
    align = 1024 if hopper else 128
    stages = 2 if spec.engine == "wgmma_tma" else 1
    sizes = {"k": tile(bn), "v": tile(bn), "q": 2 * tile(bm), "do": 2 * tile(bm), "ds": stages * bn * bm * 2,
             "lse": 2 * bm * 4, "delta": 2 * bm * 4, "bits": dkdv_bits_stages(spec) * bm * (bn // 32) * 4}
    if spec.dq_reduction == "bulk_tile":
        sizes["dq_stage"] = (bn // 16) * 16 * (d // 2) * 4   # each warp's dQ tile, as it lies in the buffer
    if spec.split_head_dim:      # P^T beside dS^T; the small buffers after the tiles, packed (shared memory is short)
        sizes = {**{n: sizes[n] for n in ("k", "v", "q", "do", "ds")}, "pt": sizes["ds"], **sizes}
    if spec.engine == "wgmma_tma":
        sizes["bars"] = 5 * 8                                 # mbarriers: kv_full, q_full x2, q_empty x2
    dq_sizes = {"q": tile(bm), "do": tile(bm), "k": 2 * tile(dbn), "v": 2 * tile(dbn), "bits": bm * (dbn // 32) * 4}
    roots = backward_root_tables(spec) * ROOT_ENTRIES * 4
    if roots:                        # the chunk nests' root tables (maskc.codegen.tile_bits), once per CTA
        sizes["roots"] = dq_sizes["roots"] = roots
    dkdv = _placed(sizes, align, tight=("lse", "delta", "bits", "roots", "bars") if spec.split_head_dim else ())
    if hopper:
        dkdv["total"] += 1024
    return {"dkdv": dkdv, "dq": _placed(dq_sizes)}


def dkdv_bits_stages(spec: BackwardSpec) -> int:
    """Stages of the dK/dV kernel's visibility bits: two in the warp-specialized kernel (its warps drift apart
    by up to a step), one where its warpgroups split the head dim (no room for two; safe there: the step's
    sync_warpgroups follows every read of them) and in the kernels that synchronize every step."""
    return 2 if spec.engine == "wgmma_tma" and not spec.split_head_dim else 1


def backward_root_tables(spec: BackwardSpec) -> int:
    """The root tables the backward's tile path keeps per CTA (none where PARTIAL tiles take the interval
    table, the per-pair predicate or the element path)."""
    return spec.predicate.root_tables if spec.partial_tiles == "bits" else 0


def dkdv_threads(spec: BackwardSpec) -> int:
    """The dK/dV kernel's block size: a warp per 16 keys (two warpgroups where they split the head dim), plus a
    producer warpgroup when warp-specialized."""
    consumers = 256 if spec.split_head_dim else spec.block_n // 16 * 32
    return consumers + (128 if spec.engine == "wgmma_tma" else 0)


def dkdv_registers(spec: BackwardSpec) -> tuple[int, int]:
    """The warp-specialized dK/dV kernel's (producer, consumer) registers per thread after setmaxnreg: FA3's
    24 / 240, which hands the consumers every register the CTA holds from launch (168 a thread at 384 threads:
    128 x 24 + 256 x 240 = 384 x 168). A split past that pool hangs the kernel (the template's static_assert)."""
    if spec.engine != "wgmma_tma":
        raise ValueError(f"the {spec.engine} dK/dV kernel does not hand registers over (setmaxnreg)")
    return 24, 240


def backward_fits(spec: BackwardSpec) -> bool:
    """Whether the backward kernels' shared memory fits one CTA's (head dim 256 leaves room for 3 root tables)."""
    return all(part["total"] <= SMEM_LIMIT for part in backward_layout(spec).values())


@dataclass(frozen=True)
class BackwardPlan:
    """Every decision of one backward source (prep, dK/dV in its modes, dQ, dQ's conversion, the stored path's
    builder of visibility words): read by the template, by the loader (each entry's shared memory) and by the
    runtime (the dK/dV kernel's block size); the rendered source, hence the cache key, is a function of it."""

    spec: BackwardSpec
    dkdv_template: str                          # the dK/dV kernel's engine: mma, wgmma or wgmma_tma's template
    dkdv_shared: tuple[tuple[str, int], ...]    # the dK/dV kernel's shared memory: byte offsets, then "total"
    dq_shared: tuple[tuple[str, int], ...]      # the deterministic dQ kernel's
    dkdv_threads: int                           # the dK/dV kernel's block size (dkdv_threads)
    bits_stages: int                            # stages of the dK/dV kernel's visibility bits (dkdv_bits_stages)
    root_tables: int                            # root tables per CTA (backward_root_tables)
    registers: tuple[int, int] | None = None    # wgmma_tma: (producer, consumer) per thread after setmaxnreg

    @property
    def layout(self) -> dict[str, dict[str, int]]:
        """The shared-memory layouts as the template reads them: {"dkdv": {...}, "dq": {...}}."""
        return {"dkdv": dict(self.dkdv_shared), "dq": dict(self.dq_shared)}

    @property
    def wgmma(self) -> bool:
        """The dK/dV kernel is Hopper's (wgmma, or wgmma_tma: warp-specialized with the copy engine)."""
        return self.spec.engine in ("wgmma", "wgmma_tma")

    @property
    def engine_includes(self) -> tuple[str, ...]:
        """The engine's device-code templates the source includes."""
        return {"wgmma": ("wgmma.cu.j2",), "wgmma_tma": ("wgmma.cu.j2", "tma.cu.j2")}.get(self.spec.engine, ())

    @property
    def tile_loader(self) -> str:
        """The device function that loads a 16-bit tile into shared memory (wgmma's in its 128-byte swizzle)."""
        return "load_tile_sw128" if self.wgmma else "load_tile"

    @property
    def wg_queries(self) -> int:
        """The N of a warpgroup's S^T product: the tile's queries, or half of them where warpgroups split the head
        dim."""
        return self.spec.block_m // 2 if self.spec.split_head_dim else self.spec.block_m

    @property
    def wgmma_widths(self) -> tuple[int, ...]:
        """The N of every wgmma product the dK/dV kernel issues."""
        d = self.spec.head_dim
        widths = {self.wg_queries, d // 2} if self.spec.split_head_dim else {self.wg_queries, d, d // 2}
        return tuple(sorted(widths))

    @property
    def dq_by_consumers(self) -> bool:
        """dQ added by the consumer warps themselves (red2 atomics), not handed to a dQ warp as whole tiles."""
        return self.spec.engine == "wgmma" or self.spec.dq_reduction == "red2"

    @property
    def shared_bytes(self) -> dict[str, int]:
        """Each entry's dynamic shared memory (the dK/dV modes' the same; prep, the conversion and the builder of
        visibility words take none)."""
        spec, dkdv = self.spec, dict(self.dkdv_shared)["total"]
        return {spec.entry_prep: 0, **{entry: dkdv for entry in spec.entries
                                       if entry in (spec.entry_dkdv, spec.entry_dkdv_det, spec.entry_dkdv_ordered)},
                spec.entry_dq: dict(self.dq_shared)["total"], spec.entry_dq_convert: 0, spec.entry_tile_words: 0}


def plan_backward(spec: BackwardSpec) -> BackwardPlan:
    """The plan of ``spec``'s backward kernels (the spec checked first: maskc.codegen.emit.check_backward_spec)."""
    layout = backward_layout(spec)
    template = {"mma": "bwd_dkdv_mma.cu.j2", "wgmma": "bwd_dkdv_wgmma.cu.j2",
                "wgmma_tma": "bwd_dkdv_tma.cu.j2"}[spec.engine]
    return BackwardPlan(spec, template, tuple(layout["dkdv"].items()), tuple(layout["dq"].items()),
                        dkdv_threads(spec), dkdv_bits_stages(spec), backward_root_tables(spec),
                        dkdv_registers(spec) if spec.engine == "wgmma_tma" else None)
