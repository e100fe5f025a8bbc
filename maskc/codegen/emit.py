"""Kernel emission: a :class:`KernelSpec` (forward) or :class:`BackwardSpec` to CUDA source
(``KernelSource``) and, without a GPU, to a cubin.

``emit_kernel`` and ``emit_backward_kernel`` are pure: they render ``templates/attention_fwd.cu.j2`` /
``attention_bwd.cu.j2`` through the spec's plan (:mod:`maskc.codegen.plan`; the forward's with the switches of
the :class:`~maskc.options.Options` given) and
attach the NVRTC options the source is meant for. ``compile_to_cubin`` runs NVRTC through CuPy's
bindings (imported lazily; NVRTC needs no GPU) and raises :class:`KernelCompileError` with NVRTC's log.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import jinja2

from maskc.codegen.plan import (SMEM_LIMIT, TILE_WORDS_PARAMS, backward_fits, backward_layout, plan_backward,
                                plan_forward)
from maskc.codegen.schedule import capability_of
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


def emit_backward_kernel(spec: BackwardSpec) -> KernelSource:
    """Render the backward kernels for ``spec`` from its plan (:func:`maskc.codegen.plan.plan_backward`): prep,
    dK/dV with and without atomic dQ, deterministic dQ, dQ conversion, the dK/dV kernels on the spec's engine
    (mma.sync, or wgmma with its dQ reduction). PARTIAL tiles build visibility bits from interval bounds where
    the predicate is made of intervals (exact masks), from ``mask_bits`` or the element path where it has a tile
    path (``spec.partial_tiles``), else by calling ``mask_visible`` per pair."""
    check_backward_spec(spec)
    plan = plan_backward(spec)
    engine: dict[str, object] = dict(dkdv_template=plan.dkdv_template, engine_includes=plan.engine_includes,
                                     tile_loader=plan.tile_loader)
    if plan.wgmma:
        engine.update(dq_reduction=spec.dq_reduction, debug_waits=False, wgmma_widths=plan.wgmma_widths,
                      wg_queries=plan.wg_queries, bits_stages=plan.bits_stages, dq_by_consumers=plan.dq_by_consumers,
                      wgmma_type="bf16" if spec.dtype == "bf16" else "f16", dkdv_registers=plan.registers)
    template = _environment(str(template_dir())).get_template(BACKWARD_TEMPLATE_NAME)
    source = template.render(spec=spec, plan=plan, layout=plan.layout, iv=interval_regions(spec),
                             row_pad=BACKWARD_ROW_PAD, dkdv_threads=plan.dkdv_threads,
                             tile_bits=spec.partial_tiles in ("bits", "stored"), elements=spec.partial_tiles == "elements",
                             stored=spec.partial_tiles == "stored", tile_words_params=TILE_WORDS_PARAMS,
                             root_tables=plan.root_tables, **engine)
    return KernelSource(spec=spec, source=source, entry=spec.entry, options=nvrtc_options(spec.arch),
                        entries=spec.entries, plan=plan)


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
