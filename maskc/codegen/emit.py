"""Kernel emission: a :class:`KernelSpec` (forward) or :class:`BackwardSpec` to CUDA source
(``KernelSource``) and, without a GPU, to a cubin.

``emit_kernel`` and ``emit_backward_kernel`` are pure: they render ``templates/attention_fwd.cu.j2`` /
``attention_bwd.cu.j2`` with the spec (the forward's through its plan, with the switches of the
:class:`~maskc.options.Options` given; the backward's with its shared-memory layout, computed here) and
attach the NVRTC options the source is meant for. ``compile_to_cubin`` runs NVRTC through CuPy's
bindings (imported lazily; NVRTC needs no GPU) and raises :class:`KernelCompileError` with NVRTC's log.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import jinja2

from maskc.codegen.plan import SMEM_LIMIT, TILE_WORDS_PARAMS, plan_forward
from maskc.codegen.schedule import capability_of
from maskc.codegen.tile_bits import ROOT_ENTRIES
from maskc.kernel_ir import (BACKWARD_ENGINES, BACKWARD_ROW_PAD, DQ_REDUCTIONS, ENGINES, BackwardSpec, KernelSource,
                              KernelSpec)
from maskc.options import DEFAULT, Options
from maskc.resources import data_dir

TEMPLATE_NAME = "attention_fwd.cu.j2"
TMA_HEAD_DIMS = (64, 128, 256)

BACKWARD_TEMPLATE_NAME = "attention_bwd.cu.j2"
BACKWARD_HEAD_DIMS = (64, 128, 256)
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = ("bf16", "fp16")

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class KernelCompileError(RuntimeError):
    """NVRTC rejected a rendered kernel; the message carries NVRTC's log."""


def template_dir() -> Path:
    """``templates/``: beside ``maskc/`` in a checkout, ``maskc/templates`` in an installed wheel."""
    return data_dir("templates")


@functools.lru_cache(maxsize=None)
def _environment(directory: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> str | None:
    """CUDA headers: the pip package ``nvidia`` (``nvidia/cu13/include``), else CUDA_PATH, else /usr/local/cuda."""
    candidates = []
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        for root in nvidia.__path__:
            candidates += [Path(root) / "cu13" / "include", Path(root) / "cuda_runtime" / "include",
                           Path(root) / "cuda_nvrtc" / "include"]
    except ImportError:
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            candidates.append(Path(os.environ[env]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda_runtime.h").is_file() or (c / "cuda_fp16.h").is_file():
            return str(c)
    return None


def nvrtc_options(arch: str = "sm_90a") -> tuple[str, ...]:
    """NVRTC's options for a target (sm_XY[a]: a cubin; compute_XY: PTX for the driver to compile)."""
    opts = [f"--gpu-architecture={arch}", "--std=c++17"]
    inc = cuda_include_dir()
    if inc is not None:
        opts.append(f"-I{inc}")
    return tuple(opts)


def _check_name_dim_dtype(spec: KernelSpec | BackwardSpec, head_dims: tuple[int, ...], what: str) -> None:
    if not _C_IDENTIFIER.match(spec.mask_name):
        raise ValueError(f"mask_name {spec.mask_name!r} is not a C identifier (the predicate generator sanitizes it)")
    if spec.head_dim not in head_dims:
        raise ValueError(f"{what}head_dim {spec.head_dim} unsupported (supported: {head_dims})")
    if spec.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} unsupported (supported: {SUPPORTED_DTYPES})")


def _check_arch(spec: KernelSpec | BackwardSpec) -> None:
    """The target can run the engine: Hopper's instructions (wgmma, setmaxnreg, the copy engine's tensor
    loads) only on sm_90a; mma.sync with bf16 from sm_80 on."""
    major, _ = capability_of(spec.arch)
    if spec.engine in ("wgmma_tma", "wgmma") and spec.arch != "sm_90a":
        raise ValueError(f"the {spec.engine} engine builds for sm_90a only (Hopper), not {spec.arch}")
    if major < 8:
        raise ValueError(f"target {spec.arch}: maskc's kernels need compute capability 8.0 or newer")


def check_spec(spec: KernelSpec) -> None:
    """The spec's invariants the template relies on (the template re-checks them with static_assert)."""
    if spec.engine not in ENGINES:
        raise ValueError(f"engine {spec.engine!r} unknown (engines: {', '.join(ENGINES)})")
    _check_arch(spec)
    if spec.engine == "wgmma_tma":
        _check_name_dim_dtype(spec, TMA_HEAD_DIMS, "wgmma_tma: ")
        if spec.num_warps not in (8, 12) or spec.block_m != 16 * spec.num_warps:
            raise ValueError(f"wgmma_tma: block_m {spec.block_m} with {spec.num_warps} warps: the warp-specialized "
                             "kernel runs two or three warpgroups of 64 query rows (block_m 128 or 192)")
        if spec.block_n % 16 or not 64 <= spec.block_n <= 128:
            raise ValueError(f"wgmma_tma: block_n {spec.block_n} must be a multiple of 16 in [64, 128]")
    else:
        _check_name_dim_dtype(spec, SUPPORTED_HEAD_DIMS, "")
        if spec.block_m % (16 * spec.num_warps) or spec.block_m // (16 * spec.num_warps) > 2:
            raise ValueError(f"block_m {spec.block_m} must be 16 or 32 rows per warp ({spec.num_warps} warps)")
        if spec.block_n % 16 or not 16 <= spec.block_n <= 128:
            raise ValueError(f"block_n {spec.block_n} must be a multiple of 16 in [16, 128]")
    for line in spec.mask_summary:
        if "\n" in line:
            raise ValueError("mask_summary lines must not contain newlines")


def interval_regions(spec: KernelSpec | BackwardSpec) -> dict | None:
    """{'allow': A, 'deny': D} when the spec's predicate is nothing but interval tests (an exact mask), else
    None: then a kernel may compute each row's intervals once per row block and test keys with bit words."""
    return spec.predicate.interval_regions


def emit_kernel(spec: KernelSpec, options: Options = DEFAULT) -> KernelSource:
    """Render the forward kernel for ``spec`` from its plan (:func:`maskc.codegen.plan.plan_forward`, with the
    experiments' switches of ``options``: overlap, pingpong, debug_waits, exp2_emulation, and its masking of
    PARTIAL tiles: partial_tiles); the predicate's source is placed verbatim."""
    check_spec(spec)
    plan = plan_forward(spec, overlap=options.overlap, pingpong=options.pingpong, debug_waits=options.debug_waits,
                        partial=options.partial_tiles, exp2_emulation=options.exp2_emulation)
    source = _environment(str(template_dir())).get_template(plan.template).render(
        spec=spec, plan=plan, iv=plan.iv, tile_bits=plan.tile_bits, elements=plan.elements,
        exp2_emulation=plan.exp2_emulation,
        wgmma_widths=plan.wgmma_widths,
        wgmma_type="bf16" if spec.dtype == "bf16" else "f16", debug_waits=plan.debug_waits)
    return KernelSource(spec=spec, source=source, entry=spec.entry, options=nvrtc_options(spec.arch),
                        entries=plan.entries, plan=plan)


TMA_CHECK_TEMPLATE_NAME = "tma_check.cu.j2"
TMA_CHECK_ENTRY = "maskc_tma_check"


def emit_tma_check() -> KernelSource:
    """The copy-engine check kernel (maskc.runtime.tma.check_copy_engine): one box of a tensor map into shared
    memory and back out, through the same helpers as the wgmma_tma kernel, with reporting waits."""
    source = _environment(str(template_dir())).get_template(TMA_CHECK_TEMPLATE_NAME).render(debug_waits=True)
    return KernelSource(spec=None, source=source, entry=TMA_CHECK_ENTRY, options=nvrtc_options())


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


def check_backward_spec(spec: BackwardSpec) -> None:
    """The backward template's assumptions (it re-checks them with static_assert)."""
    _check_name_dim_dtype(spec, BACKWARD_HEAD_DIMS, "backward: ")
    if spec.engine not in BACKWARD_ENGINES:
        raise ValueError(f"backward engine {spec.engine!r} unknown (engines: {', '.join(BACKWARD_ENGINES)})")
    _check_arch(spec)
    allowed = {"mma": ("red2",), "wgmma": DQ_REDUCTIONS,
               "wgmma_tma": ("red2",) if spec.split_head_dim else ("bulk_tile",)}[spec.engine]
    if spec.dq_reduction not in allowed:
        raise ValueError(f"dQ reduction {spec.dq_reduction!r} on the {spec.engine} engine (the wgmma kernel takes "
                         f"{', '.join(DQ_REDUCTIONS)}; wgmma_tma bulk_tile, red2 at head dim 256; mma red2)")
    if spec.head_dim == 256 and not spec.split_head_dim:
        raise ValueError(f"backward at head dim 256: the wgmma_tma engine only (got {spec.engine})")
    keys = 64 if spec.split_head_dim else 128
    if spec.engine in ("wgmma", "wgmma_tma") and (spec.block_m, spec.block_n) != (64, keys):
        raise ValueError(f"wgmma backward: tiles {spec.block_m}x{spec.block_n}; its dK/dV kernel takes 64 queries "
                         f"x {keys} keys at head dim {spec.head_dim}")
    if spec.block_m % 16 or spec.block_m < 64 or spec.block_n % 32 or spec.dq_block_n % 32:
        raise ValueError(f"backward tiles {spec.block_m}x{spec.block_n} / {spec.dq_block_n}: block_m a multiple "
                         "of 16 (>= 64), block_n and dq_block_n multiples of 32")
    if not backward_fits(spec):
        raise ValueError(f"backward of {spec.mask_name} at head dim {spec.head_dim}: the dK/dV kernel's shared "
                         f"memory ({backward_layout(spec)['dkdv']['total']} bytes) passes {SMEM_LIMIT}")


def backward_fits(spec: BackwardSpec) -> bool:
    """Whether the backward kernels' shared memory fits one CTA's (head dim 256 leaves room for 3 root tables)."""
    return all(part["total"] <= SMEM_LIMIT for part in backward_layout(spec).values())


def emit_backward_kernel(spec: BackwardSpec) -> KernelSource:
    """Render the backward kernels for ``spec`` (prep, dK/dV with and without atomic dQ, deterministic dQ,
    dQ conversion) into one source, the dK/dV kernels on the spec's engine (mma.sync, or wgmma with its dQ
    reduction). PARTIAL tiles build visibility bits from interval bounds where the predicate is made of
    intervals (exact masks), from ``mask_bits`` or the element path where it has a tile path
    (``spec.partial_tiles``), else by calling ``mask_visible`` per pair."""
    check_backward_spec(spec)
    template = _environment(str(template_dir())).get_template(BACKWARD_TEMPLATE_NAME)
    engine: dict[str, object]
    if spec.engine in ("wgmma", "wgmma_tma"):
        warp_specialized = spec.engine == "wgmma_tma"
        wg_queries = spec.block_m // 2 if spec.split_head_dim else spec.block_m   # the N of a warpgroup's S^T
        engine = dict(dkdv_template="bwd_dkdv_tma.cu.j2" if warp_specialized else "bwd_dkdv_wgmma.cu.j2",
                      engine_includes=("wgmma.cu.j2", "tma.cu.j2") if warp_specialized else ("wgmma.cu.j2",),
                      tile_loader="load_tile_sw128", dq_reduction=spec.dq_reduction, debug_waits=False,
                      wgmma_widths=sorted({wg_queries, spec.head_dim // 2} if spec.split_head_dim
                                          else {wg_queries, spec.head_dim, spec.head_dim // 2}),
                      wg_queries=wg_queries, bits_stages=dkdv_bits_stages(spec),
                      dq_by_consumers=spec.engine == "wgmma" or spec.dq_reduction == "red2",
                      wgmma_type="bf16" if spec.dtype == "bf16" else "f16",
                      dkdv_registers=dkdv_registers(spec) if warp_specialized else None)
    else:
        engine = dict(dkdv_template="bwd_dkdv_mma.cu.j2", engine_includes=(), tile_loader="load_tile")
    source = template.render(spec=spec, layout=backward_layout(spec), iv=interval_regions(spec),
                             row_pad=BACKWARD_ROW_PAD, dkdv_threads=dkdv_threads(spec),
                             tile_bits=spec.partial_tiles in ("bits", "stored"), elements=spec.partial_tiles == "elements",
                             stored=spec.partial_tiles == "stored", tile_words_params=TILE_WORDS_PARAMS,
                             root_tables=backward_root_tables(spec), **engine)
    return KernelSource(spec=spec, source=source, entry=spec.entry, options=nvrtc_options(spec.arch),
                        entries=spec.entries)


def compile_to_cubin(src: KernelSource) -> bytes:
    """Compile with NVRTC (no GPU needed) and return the cubin (PTX for a compute_XY target); raise
    KernelCompileError with the log."""
    return compile_with_log(src)[0]


def is_ptx(src: KernelSource) -> bool:
    """Whether ``src`` builds to PTX (a compute_XY target) rather than a cubin."""
    return any(o.startswith("--gpu-architecture=compute_") for o in src.options)


def compile_with_log(src: KernelSource, extra_options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """(cubin, NVRTC's log) of ``src`` compiled with its options and ``extra_options`` (for instance
    ``--ptxas-options=-v`` for ptxas's register report and its performance advisories)."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(src.source, f"{src.entry}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(src.options) + list(extra_options))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(f"NVRTC failed to compile {src.entry} ({exc}):\n{log}") from None
        binary = nvrtc.getPTX(prog) if is_ptx(src) else nvrtc.getCUBIN(prog)
        if isinstance(binary, str):
            binary = binary.encode()
        return binary, nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def nvrtc_version() -> tuple[int, int]:
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getVersion())
