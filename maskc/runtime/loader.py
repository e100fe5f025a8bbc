"""Compiled kernels: NVRTC's cubins cached in memory and on disk, loaded into CuPy modules.

A kernel is keyed by a hash of its source, NVRTC options (include directories left out: host paths), NVRTC's
version and maskc's; the disk cache (:mod:`maskc.runtime.cache`, at ``Options.cache_path``) keeps the cubins,
so a second process loads what the first compiled.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from maskc.codegen.emit import compile_to_cubin, is_ptx, nvrtc_version
from maskc.codegen.plan import BackwardPlan
from maskc.builder_ir import BuilderSpec
from maskc.codegen.moves import MoveSpec
from maskc.kernel_ir import BackwardSpec, KernelSource
from maskc.options import Options, options_of
from maskc.runtime import cache


def _maskc_version() -> str:
    try:
        import maskc

        v = getattr(maskc, "__version__", None)
        if v:
            return str(v)
    except ImportError:  # pragma: no cover
        pass
    try:
        from importlib.metadata import version

        return version("maskc")
    except Exception:
        return "0+unknown"


def resolved_options(options: Options | None, where: str = "maskc's runtime") -> Options:
    """The options of a call to ``where``: those given, else those of the environment (a TypeError for what is
    not an Options: :func:`maskc.options.options_of`)."""
    return options_of(options, where)


def disk_cache(options: Options | None = None) -> cache.DiskCache:
    """The disk cache at ``options.cache_path`` (one object per directory and process)."""
    return cache.at(resolved_options(options).cache_path)


@dataclass
class LoadedKernel:
    source: KernelSource
    module: object          # cupy.RawModule (kept alive)
    functions: dict         # entry name -> cupy.RawKernel, for every entry of the source
    shared: dict            # entry name -> dynamic shared memory bytes of one CTA
    cubin_path: Path
    compiled: bool          # False when the cubin came from the disk cache

    @property
    def function(self):     # the main entry (the forward kernel, the dK/dV kernel, ...)
        return self.functions[self.source.entry]

    @property
    def shared_bytes(self) -> int:
        return self.shared[self.source.entry]


def _shared_by_entry(src: KernelSource) -> dict[str, int]:
    if src.spec is None or isinstance(src.spec, (BuilderSpec, MoveSpec)):   # static shared memory only (or none)
        return {entry: 0 for entry in src.functions}
    assert src.plan is not None         # a forward or backward source always has its plan
    if isinstance(src.plan, BackwardPlan):
        return src.plan.shared_bytes
    # the forward's shared memory; the stored path's builder of visibility words (its other entry) takes none
    return {entry: src.plan.shared_bytes if entry == src.entry else 0 for entry in src.functions}


_kernels: dict[str, LoadedKernel] = {}


def kernel_key(src: KernelSource) -> str:
    """The cache key of ``src``: a hash of its source, NVRTC options, NVRTC's version and maskc's. Include
    directories (``-I``) are left out: they are host paths, and the templates include no header."""
    options = [o for o in src.options if not o.startswith("-I")]
    h = hashlib.sha256()
    for part in (src.source, "\0".join(options), repr(nvrtc_version()), _maskc_version()):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


def binary_name(src: KernelSource) -> str:
    """The disk cache's entry for ``src``'s cubin (PTX for a compute_XY target)."""
    return f"{src.entry}-{kernel_key(src)[:32]}.{'ptx' if is_ptx(src) else 'cubin'}"


def load_kernel(src: KernelSource, options: Options | None = None) -> LoadedKernel:
    """The kernel for ``src``: from memory, else the disk cache's cubin (in ``options.cache_path``), else
    NVRTC (then written to disk)."""
    key = kernel_key(src)
    hit = _kernels.get(key)
    if hit is not None:
        return hit
    import cupy

    path, compiled = disk_cache(options).artifact(binary_name(src), lambda: compile_to_cubin(src))
    module = cupy.RawModule(path=str(path))
    shared = _shared_by_entry(src)
    functions = {}
    for entry in src.functions:
        functions[entry] = module.get_function(entry)
        if shared[entry] > 48 * 1024:
            functions[entry].max_dynamic_shared_size_bytes = shared[entry]
    loaded = LoadedKernel(src, module, functions, shared, path, compiled)
    _kernels[key] = loaded
    return loaded
