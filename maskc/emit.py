"""Kernel emission: a :class:`KernelSpec` to CUDA source (``KernelSource``) and, without a GPU, to a cubin.

``emit_kernel`` is pure: it renders ``templates/attention_fwd.cu.j2`` with the spec as its one context object
and attaches the NVRTC options the source is meant for. ``compile_to_cubin`` runs NVRTC through CuPy's
bindings (imported lazily; NVRTC needs no GPU) and raises :class:`KernelCompileError` with NVRTC's log.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import jinja2

from .kernel_ir import KernelSource, KernelSpec

TEMPLATE_NAME = "attention_fwd.cu.j2"
GPU_ARCH = "sm_90a"
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = ("bf16", "fp16")

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class KernelCompileError(RuntimeError):
    """NVRTC rejected a rendered kernel; the message carries NVRTC's log."""


def template_dir() -> Path:
    """``templates/``: beside ``maskc/`` in a checkout, ``maskc/templates`` in an installed wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / TEMPLATE_NAME).is_file():
            return candidate
    raise FileNotFoundError(f"{TEMPLATE_NAME} not found in {here / 'templates'} or {here.parent / 'templates'}")


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


def nvrtc_options() -> tuple[str, ...]:
    opts = [f"--gpu-architecture={GPU_ARCH}", "--std=c++17"]
    inc = cuda_include_dir()
    if inc is not None:
        opts.append(f"-I{inc}")
    return tuple(opts)


def check_spec(spec: KernelSpec) -> None:
    """The spec's invariants the template relies on (the template re-checks them with static_assert)."""
    if not _C_IDENTIFIER.match(spec.mask_name):
        raise ValueError(f"mask_name {spec.mask_name!r} is not a C identifier (the predicate generator sanitizes it)")
    if spec.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {spec.head_dim} unsupported (supported: {SUPPORTED_HEAD_DIMS})")
    if spec.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} unsupported (supported: {SUPPORTED_DTYPES})")
    if spec.block_m % (16 * spec.num_warps) or spec.block_m // (16 * spec.num_warps) > 2:
        raise ValueError(f"block_m {spec.block_m} must be 16 or 32 rows per warp ({spec.num_warps} warps)")
    if spec.block_n % 16 or not 16 <= spec.block_n <= 128:
        raise ValueError(f"block_n {spec.block_n} must be a multiple of 16 in [16, 128]")
    for line in spec.mask_summary:
        if "\n" in line:
            raise ValueError("mask_summary lines must not contain newlines")


def shared_memory_bytes(spec: KernelSpec) -> int:
    """Dynamic shared memory of one CTA: the Q tile and two K and two V buffers (16-bit elements)."""
    return 2 * spec.head_dim * (spec.block_m + 4 * spec.block_n)


def emit_kernel(spec: KernelSpec) -> KernelSource:
    """Render the forward kernel for ``spec``; the predicate text is placed verbatim."""
    check_spec(spec)
    template = _environment(str(template_dir())).get_template(TEMPLATE_NAME)
    source = template.render(spec=spec)
    return KernelSource(spec=spec, source=source, entry=spec.entry, options=nvrtc_options())


def compile_to_cubin(src: KernelSource) -> bytes:
    """Compile with NVRTC (no GPU needed) and return the cubin; raise KernelCompileError with the log."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(src.source, f"{src.entry}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(src.options))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(f"NVRTC failed to compile {src.entry} ({exc}):\n{log}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def nvrtc_version() -> tuple[int, int]:
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getVersion())
