"""The run-time stages: tile classes, the packed descriptor, the kernel's source.

These are the run-time half of maskc's IR (the compile-time half, source to canonical regions, is in
:mod:`maskc.ir`; the bound parameter values they start from in :mod:`maskc.bound_params`, the descriptor
builder's plan in :mod:`maskc.builder_ir`). Descriptor arrays are int32 and C-contiguous, to be uploaded to
the GPU as they are.
"""
from __future__ import annotations

import functools
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from maskc.errors import BindError
from maskc.runs import (MAX_TILES, RunBudget, dense_of, front_rows, heaviest_first, ordered_columns, partial_slots,
                        row_costs, sizes_text, transposed, turn_section_pairs)
from maskc.runs import EMPTY, FULL, PARTIAL  # noqa: F401  (the tile kinds, as the IR's users import them)

if TYPE_CHECKING:
    from maskc.builder_ir import BuilderSpec
    from maskc.codegen.moves import MoveSpec
    from maskc.codegen.plan import BackwardPlan, ForwardPlan

# The default cap on a descriptor's bytes (maskc.runs.RunBudget): 1 GiB. BoundMask.descriptor(max_bytes=)
# and Options(max_descriptor_bytes=) raise it.
MAX_DESCRIPTOR_BYTES = 1 << 30
# Forward kernel engines (KernelSpec.engine): mma.sync everywhere; on Hopper, wgmma fed by the copy engine
# (TMA) from a producer warp.
ENGINES = ("mma", "wgmma_tma")
BACKWARD_ENGINES = ("mma", "wgmma", "wgmma_tma")   # the dK/dV kernel's
# How the wgmma dK/dV kernel adds its dQ tile to the fp32 buffer: bulk_tile (the buffer laid out in per-warp
# tiles of 16 rows x D / 2 in fragment order: each warp stages its tile in shared memory and one lane hands
# it to the copy engine as one bulk reduction per step), red2 (a row-major buffer, vector reductions of two
# floats per thread from the fragments: what the mma kernel always does). bench/NOTES.md, runs 25-26, has
# these and the variants tried and dropped (among them `none`, a timing experiment that left dQ out).
DQ_REDUCTIONS = ("bulk_tile", "red2")
# the deterministic wgmma_tma backward's launch order, which its dQ turns follow (maskc.runs.ordered_columns):
# "shortest" first, or "wave": the first wave shortest first and the other columns longest first
DQ_TURN_ORDERS = ("shortest", "wave")
# how the deterministic wgmma_tma backward computes dQ (Options.deterministic_dq): "turns" (the dK/dV kernel adds
# each query block's dQ in turns, in the launch order) or "kernel" (dK/dV without dQ, then its own dQ kernel over
# the rows' view: two more products per tile, no waiting in turns)
DETERMINISTIC_DQ = ("turns", "kernel")
# How the wgmma_tma forward and the backward mask PARTIAL tiles of exact masks with chunked regions
# (Options.partial_tiles, ForwardPlan.partial_tiles, BackwardSpec.partial_tiles): "bits" (maskc.codegen.tile_bits),
# "elements" (maskc.codegen.elements), "stored" (the forward reads each PARTIAL tile's visibility words, which a
# kernel builds from mask_bits once per binding, where the mask does not read h and the binding's descriptor is
# the host's: maskc.codegen.plan; the backward takes "bits"), "auto" (those of AUTO_STORED, else "bits").
PARTIAL_TILES = ("auto", "bits", "elements", "stored")
# the choices that take the stored path where it applies ("auto" since run 73: 1.28-1.54x the tile path's forward
# at 32K, bench/NOTES.md)
AUTO_STORED = ("auto", "stored")
# Options.exp2_emulation, ForwardPlan.exp2_emulation: 1 column tile of the softmax in N takes exp2 on the FMA pipe
EXP2_EMULATION = (0, 1, 2, 4, 8)
# Rows per (batch, head) of the backward's LSE_log2, delta and fp32 dQ buffers: seq_len rounded up to this, so
# that a 64-query step's rows are whole and 256-byte aligned (the copy engine reads them in one piece).
BACKWARD_ROW_PAD = 64


@dataclass(frozen=True, eq=False)
class TileMap:
    """Classification's result, as runs: for row block ``r = b * QT + i``, the key blocks
    ``runs[run_offsets[r]:run_offsets[r+1]]`` = (kv_begin, kv_end, kind), kind PARTIAL or FULL;
    blocks in no run are EMPTY. ``classes`` is the same as a dense int8[B, QT, KT] grid.

    ``exact`` says whether every class is exact (no PARTIAL tile is really full or empty); when
    False the classes are still sound: FULL and EMPTY are never wrong.
    """

    block_m: int
    block_n: int
    seq_len: int
    kv_len: int
    batch: int
    run_offsets: np.ndarray     # int32[B*QT + 1]
    runs: np.ndarray            # int32[n_runs, 3]
    exact: bool

    @property
    def n_q_blocks(self) -> int:
        return -(-self.seq_len // self.block_m)

    @property
    def n_kv_blocks(self) -> int:
        return -(-self.kv_len // self.block_n)

    def counts(self) -> dict[str, int]:
        """Tiles of each class over the batch, from the runs (the dense grid is not built)."""
        widths = (self.runs[:, 1] - self.runs[:, 0]).astype(np.int64)
        full, partial = int(widths[self.runs[:, 2] == FULL].sum()), int(widths[self.runs[:, 2] == PARTIAL].sum())
        total = self.batch * self.n_q_blocks * self.n_kv_blocks
        return {"FULL": full, "PARTIAL": partial, "EMPTY": total - full - partial}

    @property
    def nbytes(self) -> int:
        """The bytes of the run-length rows."""
        return self.run_offsets.nbytes + self.runs.nbytes

    def __repr__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts().items())
        return (f"TileMap({self.block_m}x{self.block_n} tiles, seq_len {self.seq_len}, kv_len {self.kv_len}, "
                f"batch {self.batch}: {counts}; {'exact' if self.exact else 'sound'})")

    @functools.cached_property
    def classes(self) -> np.ndarray:
        """The dense int8[B, QT, KT] grid, built on first use from the runs (for those who ask: nothing on
        the way to a descriptor does). A BindError past MAX_TILES (2**28) tiles: the runs stay the way to
        read a grid that large."""
        tiles = self.batch * self.n_q_blocks * self.n_kv_blocks
        if tiles > MAX_TILES:
            raise BindError(f"the dense grid of {self.batch} x {self.n_q_blocks} x {self.n_kv_blocks} = {tiles} tiles "
                            f"({self.block_m} x {self.block_n} at seq_len {self.seq_len}, kv_len {self.kv_len}) "
                            f"is past {MAX_TILES} (2**28) tiles", hint="read the runs (run_offsets, runs, counts()) "
                            "instead, or use larger tiles")
        grid = dense_of(self.run_offsets, self.runs, self.n_kv_blocks)
        return grid.reshape(self.batch, self.n_q_blocks, self.n_kv_blocks)


@dataclass(frozen=True, eq=False)
class Descriptor:
    """The compact, kernel-ready description of a bound mask, for one tile shape.

    Notation: ``B`` batch elements, ``QT = ceil(seq_len / block_m)`` query blocks (``q_block``),
    ``KT = ceil(kv_len / block_n)`` key/value blocks (``kv_block``); a *row block* is one
    (batch element, q_block) pair, numbered ``b * QT + i``.

    ``run_offsets`` int32[B*QT + 1]
        CSR offsets: the runs of row block ``r`` are ``runs[run_offsets[r]:run_offsets[r+1]]``.
    ``runs`` int32[n_runs, 3]
        ``(kv_begin, kv_end, kind)``: key blocks ``kv_begin <= j < kv_end`` all of ``kind``
        (1 PARTIAL: apply the predicate, 2 FULL: no masking). EMPTY blocks are never listed.
        Runs of one row block are sorted, disjoint, and adjacent runs differ in kind.
    ``work_order`` int32[B*QT]
        Every row block exactly once, heaviest first (cost = FULL + 1.25 * PARTIAL blocks), so a
        grid launched in this order finishes its longest rows first (LPT). Row blocks without runs
        come last: their rows see no key and the kernel must still write O = 0 and LSE = -inf.
    ``mask_data`` int32[...], ``mask_offsets`` int32[B+1]
        The parameter tables the generated predicate reads for PARTIAL blocks; batch element ``b``'s
        table is ``mask_data[mask_offsets[b]:mask_offsets[b+1]]`` and its layout is documented in the
        generated ``mask_row`` function.
    ``col_offsets`` int32[B*KT + 1], ``col_runs`` int32[n_col_runs, 3], ``col_work_order`` int32[B*KT]
        The transposed view for the backward pass: for column block ``b * KT + j``, runs of
        ``(q_begin, q_end, kind)`` over query blocks, and the column blocks heaviest first (built on
        first use, from the runs: never the tile grid).

    Every array grows with the runs and the blocks, never with the tile grid; ``nbytes`` is their total,
    at most ``max_bytes`` (a BindError otherwise, also when the transposed view is built).

    The loop that rebuilds the tile classes (and so, with the predicate, the mask)::

        tiles = np.zeros((B, QT, KT), np.int8)
        for r in range(B * QT):
            for begin, end, kind in runs[run_offsets[r]:run_offsets[r + 1]]:
                tiles[r // QT, r % QT, begin:end] = kind
    """

    tile_map: TileMap
    work_order: np.ndarray
    mask_data: np.ndarray
    mask_offsets: np.ndarray
    max_bytes: int = MAX_DESCRIPTOR_BYTES

    # The tile shape, sizes and runs are the tile map's.
    block_m = property(lambda self: self.tile_map.block_m)
    block_n = property(lambda self: self.tile_map.block_n)
    batch = property(lambda self: self.tile_map.batch)
    seq_len = property(lambda self: self.tile_map.seq_len)
    kv_len = property(lambda self: self.tile_map.kv_len)
    run_offsets = property(lambda self: self.tile_map.run_offsets)
    runs = property(lambda self: self.tile_map.runs)
    n_q_blocks = property(lambda self: self.tile_map.n_q_blocks)
    n_kv_blocks = property(lambda self: self.tile_map.n_kv_blocks)

    def __repr__(self) -> str:
        return (f"Descriptor({self.block_m}x{self.block_n} tiles, seq_len {self.seq_len}, kv_len {self.kv_len}, "
                f"batch {self.batch}: {self.runs.shape[0]} runs over {self.run_offsets.size - 1} row blocks, "
                f"{self.mask_data.size} mask_data ints)")

    @property
    def nbytes(self) -> int:
        """The bytes of every array (the transposed view's once built)."""
        arrays = (self.run_offsets, self.runs, self.work_order, self.mask_data, self.mask_offsets)
        built = (self.__dict__.get("_transposed", ()) + sum(self.__dict__.get("_turns", {}).values(), ())
                 + self.__dict__.get("partial_slots", ()) + self.__dict__.get("col_partial_slots", ()))
        return sum(a.nbytes for a in arrays) + sum(a.nbytes for a in built)

    @functools.cached_property
    def _transposed(self):
        offsets, runs = transposed(self.run_offsets, self.runs, self.batch, self.n_q_blocks, self.n_kv_blocks)
        work = heaviest_first(offsets, runs)
        what = functools.partial(sizes_text, self.seq_len, self.kv_len, self.block_m, self.block_n, self.batch)
        RunBudget(self.max_bytes, what, self.nbytes + offsets.nbytes + runs.nbytes + work.nbytes)
        return offsets, runs, work

    @property
    def col_offsets(self) -> np.ndarray:
        """Built on first use (a backward pass needs it, the forward does not)."""
        return self._transposed[0]

    @property
    def col_runs(self) -> np.ndarray:
        return self._transposed[1]

    @property
    def col_work_order(self) -> np.ndarray:
        return self._transposed[2]

    @functools.cached_property
    def partial_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """The row view's PARTIAL tiles numbered in the order the forward walks them: ``(run_slots, tiles)`` of
        :func:`maskc.runs.partial_slots`, which the forward's stored path indexes each tile's visibility words
        by (ForwardPlan.partial_tiles "stored"); built on first use."""
        return self._budgeted_slots(self.run_offsets, self.runs)

    @functools.cached_property
    def col_partial_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """The column view's PARTIAL tiles numbered in the order the dK/dV kernel walks a column's runs
        (:func:`maskc.runs.partial_slots` of col_offsets and col_runs: tiles[n] is (column block, query block));
        the backward's stored path indexes each step's bits by them (BackwardSpec.partial_tiles "stored")."""
        return self._budgeted_slots(self.col_offsets, self.col_runs)

    def _budgeted_slots(self, offsets: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slots = partial_slots(offsets, runs)
        what = functools.partial(sizes_text, self.seq_len, self.kv_len, self.block_m, self.block_n, self.batch)
        RunBudget(self.max_bytes, what, self.nbytes + sum(a.nbytes for a in slots))
        return slots

    def front(self, pairs: int, section_pairs: int, sms: int, transposed: bool = False) -> int:
        """:func:`maskc.runs.front_rows` of the row view's work order (the column view's, ``transposed``) for a
        launch over ``pairs`` (batch, head) pairs in L2 sections of ``section_pairs`` on ``sms`` SMs: how many of
        its first rows go for every pair before the sections; remembered per value."""
        cache = self.__dict__.setdefault("_front", {})
        key = (pairs, section_pairs, sms, transposed)
        if key not in cache:
            offsets, runs, order = ((self.col_offsets, self.col_runs, self.col_work_order) if transposed
                                    else (self.run_offsets, self.runs, self.work_order))
            cache[key] = front_rows(row_costs(offsets, runs), order, pairs, section_pairs, sms)
        return cache[key]

    def turn_sections(self, pairs: int, section_pairs: int, sms: int, group: int = 1) -> int:
        """:func:`maskc.runs.turn_section_pairs` of the column view: the pairs per section of a deterministic
        backward whose dQ additions take turns, at least ``section_pairs``; remembered per value."""
        cache = self.__dict__.setdefault("_turn_sections", {})
        key = (pairs, section_pairs, sms, group)
        if key not in cache:
            cache[key] = turn_section_pairs(self.col_offsets, self.col_runs, self.batch, self.n_q_blocks, pairs,
                                            section_pairs, sms, group)
        return cache[key]

    def turns(self, first_wave: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The column view for a deterministic backward whose dQ additions take turns: (order, rank_base, ranks) of
        :func:`maskc.runs.ordered_columns`, with its ``first_wave`` (None: every column shortest first); built on
        first use per value."""
        cache = self.__dict__.setdefault("_turns", {})
        if first_wave not in cache:
            turns = ordered_columns(self.col_offsets, self.col_runs, self.batch, self.n_q_blocks, first_wave)
            what = functools.partial(sizes_text, self.seq_len, self.kv_len, self.block_m, self.block_n, self.batch)
            RunBudget(self.max_bytes, what, self.nbytes + sum(a.nbytes for a in turns))
            cache[first_wave] = turns
        return cache[first_wave]


@dataclass(frozen=True)
class ScoreCode:
    """A mask's score modifier as device code (:mod:`maskc.codegen.score`): ``code`` defines ``ScoreHead``,
    ``score_head``, ``score_mod`` and ``score_mod_grad`` (with ``row_terms`` or ``unit``, also ``score_mod_fwd``,
    ``score_row`` and ``score_unit``: the forward's scores without the terms that read no key position and divided
    by a positive factor, those terms for its LSE, and the factor for its softmax scale); ``helpers``
    the device functions it calls (``tanh.approx``);
    ``source`` is both. ``unit_slope``: its derivative is 1 everywhere (an additive modifier), so the backward
    multiplies dS by nothing. ``summary``: the modifier in one line."""

    code: str = field(repr=False)
    unit_slope: bool
    summary: str
    helpers: str = field(default="", repr=False)
    row_terms: bool = False     # the forward calls score_mod_fwd and adds score_row to the LSE (per-row terms)
    unit: bool = False          # the forward calls score_mod_fwd, its softmax scale times score_unit (softcap's factor)

    @property
    def forward_variant(self) -> bool:
        """The forward calls score_mod_fwd (with the work item's origin), not score_mod."""
        return self.row_terms or self.unit

    @property
    def source(self) -> str:
        return self.helpers + self.code


@dataclass(frozen=True)
class Predicate:
    """The mask as device code (:mod:`maskc.codegen.predicate`), with what the kernels need to know of it kept as
    data, so that nothing reads the generated C. ``code`` defines (``helpers`` the functions it calls, such
    as Python's floor division and the segment lookup; ``source`` is both)::

        struct MaskRow { ... };   // what one query row needs, computed once per row and tile
        __device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q);
        __device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k);

    where ``mask`` is ``mask_data + mask_offsets[b]``; ``mask_row`` sets ``row.lo{i}`` / ``row.hi{i}``, the key
    interval of region i (allow regions 0 .. allow-1, then the deny regions). With ``intervals_only``,
    ``mask_visible`` is nothing but those interval tests (no per-key atoms: an exact mask), so a kernel may
    compute the intervals once per row block and test many keys at once with bit words. With ``tile_bits``
    (exact masks with chunked regions: keys through ``//``, ``%`` and squares), ``code`` also defines::

        template <class Word, int WORDS>
        __device__ void mask_bits(const MaskRow& row, const int* mask, int b, int h, int q, int k0,
                                  Word (&bits)[WORDS]);    // the row's visible keys from k0 as bit words

    which a kernel calls once per row and tile instead of ``mask_visible`` per key. Such a predicate also carries
    ``elements``: the element path's code (:mod:`maskc.codegen.elements`: the raster mask's test per pair, from
    row and key-column values), which a kernel places after ``source`` when it masks PARTIAL tiles per element
    (``ForwardPlan.partial_tiles``, ``BackwardSpec.partial_tiles``); empty for other masks.
    """

    code: str = field(repr=False)       # CUDA: MaskRow, mask_row and mask_visible of this mask
    allow: int
    deny: int
    intervals_only: bool
    helpers: str = field(default="", repr=False)   # CUDA: the functions every predicate's code calls
    tile_bits: bool = False             # code defines mask_bits (see above)
    root_tables: int = 0                # tables mask_bits may read as `roots` (maskc.codegen.tile_bits)
    elements: str = field(default="", repr=False)   # CUDA: the element path (see above), with tile_bits
    reads_head: bool = False            # the mask reads h (its visibility differs between heads)

    @property
    def source(self) -> str:
        """The whole device code: the helpers, then the mask's own."""
        return self.helpers + self.code

    @property
    def interval_regions(self) -> dict | None:
        """{'allow': A, 'deny': D} when a kernel may use the interval table, else None."""
        return {"allow": self.allow, "deny": self.deny} if self.intervals_only and self.allow else None

    def partial_path(self, choice: str = "auto", stored: bool = False) -> str:
        """How a kernel with a tile path masks PARTIAL tiles for ``choice`` (PARTIAL_TILES): "bits" (mask_bits),
        "elements" (the element path) or, for a kernel that can read them (``stored``: the forward), "stored"
        (visibility words built once per binding, for the choices in AUTO_STORED), where the mask does not
        read h (the words serve every head); "" for a predicate without a tile path (the interval table, or
        mask_visible per pair). Kernels that can read stored words: the wgmma_tma forward, and the wgmma_tma
        dK/dV kernel where its bits have two stages (not at head dim 256)."""
        if not self.tile_bits or self.interval_regions is not None:
            return ""
        if choice == "elements" and self.elements:
            return "elements"
        return "stored" if choice in AUTO_STORED and stored and not self.reads_head else "bits"


@dataclass(frozen=True)
class KernelSpec:
    """Every decision the forward-kernel template needs, made in Python (schedule pass). ``predicate``: the
    mask's device code; the kernel calls it on PARTIAL blocks only."""

    mask_name: str          # a C identifier, already sanitized
    head_dim: int
    dtype: str              # "bf16" or "fp16"
    block_m: int
    block_n: int
    num_warps: int
    predicate: Predicate
    mask_summary: tuple[str, ...] = field(default=())   # comment lines for the kernel's header
    # "mma": mma.sync (attention_fwd.cu.j2); Hopper: "wgmma_tma" (copy engine + a producer warp,
    # attention_fwd_tma.cu.j2)
    engine: str = "mma"
    arch: str = "sm_90a"    # NVRTC's target (maskc.codegen.schedule.ARCHES, or compute_XY for PTX)
    score: ScoreCode | None = None      # the score modifier, applied to every visible pair's score
    # the binding's modifier bounds every score closely enough for a softmax against a fixed maximum
    # (BoundMask.fixed_max; the wgmma_tma forward's plan decides whether it runs one: ForwardPlan.fixed_max)
    fixed_max: bool = False

    def __repr__(self) -> str:
        """Every field without a default, and those with one where they differ from it (the mask's summary lines
        already make it long)."""
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.default is MISSING or getattr(self, f.name) != f.default]
        return f"KernelSpec({', '.join(shown)})"

    @property
    def entry(self) -> str:
        return f"maskc_fwd_{self.mask_name}"

    @property
    def entry_tile_words(self) -> str:
        """The stored path's builder of PARTIAL tiles' visibility words (ForwardPlan.partial_tiles "stored")."""
        return f"maskc_tile_words_{self.mask_name}"

    @property
    def threads(self) -> int:
        """Threads per CTA: num_warps compute warps, plus the wgmma_tma kernel's producer warpgroup (a whole
        warpgroup: setmaxnreg hands registers over per warpgroup; one lane of it does the work)."""
        return 32 * self.num_warps + (128 if self.engine == "wgmma_tma" else 0)


@dataclass(frozen=True)
class BackwardSpec:
    """Every decision the backward-kernel template needs (see ``templates/attention_bwd.cu.j2``).

    The dK/dV kernel walks the transposed view of the descriptor for tiles ``block_m x block_n`` (one
    CTA per key block of ``block_n`` keys, ``block_m`` queries per step); the deterministic dQ kernel
    walks the row runs of the descriptor for tiles ``block_m x dq_block_n``. ``predicate`` is the same
    generated device code as the forward kernel's.
    """

    mask_name: str
    head_dim: int
    dtype: str
    block_m: int
    block_n: int
    dq_block_n: int
    predicate: Predicate
    mask_summary: tuple[str, ...] = field(default=())
    engine: str = "mma"      # the dK/dV kernel's: "mma" (mma.sync), "wgmma" (Hopper warpgroup products, loads by
                             # every thread) or "wgmma_tma" (warp-specialized: copy-engine loads, a dQ warp)
    dq_reduction: str = "red2"   # how the wgmma dK/dV kernel adds dQ to the fp32 buffer (DQ_REDUCTIONS)
    arch: str = "sm_90a"         # NVRTC's target, as KernelSpec.arch
    score: ScoreCode | None = None   # the score modifier (as KernelSpec.score); dS goes through its derivative
    # how PARTIAL tiles' visibility bits are built where the predicate has a tile path (Predicate.partial_path):
    # "bits" (mask_bits per row and word), "elements" (the element path, a warp's ballot per row and word),
    # "stored" (the warp-specialized dK/dV kernel's producer copies each PARTIAL step's bits, which the source's
    # builder, entry_tile_words, computes once per binding); "" for other masks
    partial_tiles: str = ""

    entry_prep = property(lambda self: f"maskc_bwd_prep_{self.mask_name}")
    entry_dkdv = property(lambda self: f"maskc_bwd_dkdv_{self.mask_name}")
    entry_dkdv_det = property(lambda self: f"maskc_bwd_dkdv_det_{self.mask_name}")
    entry_dkdv_ordered = property(lambda self: f"maskc_bwd_dkdv_ordered_{self.mask_name}")   # wgmma_tma only
    entry_dq = property(lambda self: f"maskc_bwd_dq_{self.mask_name}")
    entry_dq_convert = property(lambda self: f"maskc_bwd_dq_convert_{self.mask_name}")
    entry_tile_words = property(lambda self: f"maskc_bwd_tile_words_{self.mask_name}")   # "stored" only

    @property
    def entry(self) -> str:
        return self.entry_dkdv

    @property
    def split_head_dim(self) -> bool:
        """Whether the Hopper dK/dV kernel's two warpgroups share the key block's 64 keys, splitting each step's
        queries (S^T, dP^T) and the head dim (dK, dV, dQ), with P^T and dS^T passed through shared memory:
        head dim 256, whose dK and dV for 64 keys do not fit one warpgroup's registers. Otherwise each
        warpgroup owns 64 of the block's 128 keys, all their columns."""
        return self.engine == "wgmma_tma" and self.head_dim == 256

    @property
    def dq_in_turns(self) -> bool:
        """Whether the dK/dV kernel has a deterministic variant adding dQ in turns (entry_dkdv_ordered): the
        warp-specialized kernel whose dQ warp adds whole tiles."""
        return self.engine == "wgmma_tma" and self.dq_reduction == "bulk_tile"

    @property
    def entries(self) -> tuple[str, ...]:
        ordered = (self.entry_dkdv_ordered,) if self.dq_in_turns else ()
        stored = (self.entry_tile_words,) if self.partial_tiles == "stored" else ()
        return (self.entry_prep, self.entry_dkdv, self.entry_dkdv_det, *ordered, self.entry_dq, self.entry_dq_convert,
                *stored)


@dataclass(frozen=True)
class KernelSource:
    """Rendered CUDA: ``source`` defines the ``extern "C" __global__`` functions ``entries`` (``entry``
    first; a forward source has only that one, or with the stored path its builder of visibility words)."""

    spec: KernelSpec | BackwardSpec | BuilderSpec | MoveSpec | None   # None: a check kernel of no mask (emit_tma_check)
    source: str = field(repr=False)
    entry: str
    options: tuple[str, ...]   # NVRTC options the source is meant to be compiled with
    entries: tuple[str, ...] = ()
    plan: ForwardPlan | BackwardPlan | None = None   # the kernels' plan (shared memory, parameters, block size)

    @property
    def functions(self) -> tuple[str, ...]:
        return self.entries or (self.entry,)
