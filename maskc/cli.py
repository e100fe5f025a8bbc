"""The ``maskc`` command: a thin shell over the Python API (compile, run, lint, show, explain, cache).

Every :class:`~maskc.errors.MaskError` is printed as ``file:line:col: error: ...`` with its caret and
exits 1, as does a problem with the machine or an argument that only shows once it is used (a file that
cannot be written, tiles the kernel cannot take): ``maskc: error: ...``. A malformed command line exits
2 with click's usage message. An unexpected exception is a bug in maskc: it prints ``maskc: internal
error: ...`` and exits 2. No traceback ever reaches the user. The GPU is optional: it is looked for,
never assumed. Subcommands live here, but ``run`` (:mod:`maskc.cli_run`); their shared options and
defaults in :mod:`maskc.cli_shared`.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import click

from maskc import __version__
from maskc.analysis.values import INT32
from maskc.cli_run import run_cmd
from maskc.cli_shared import (CliError, bind_from_cli, dtype_option, environment_options, gpu_available,
                              head_dim_option, import_path_option, kv_len_option, load_mask, mask_option, param_option,
                              parse_params, refuse_overwriting_sources, replacing, seq_len_option,
                              write_output)
from maskc.codegen.schedule import ARCHES, check_target
from maskc.errors import BindError, MaskError
from maskc.kernel_ir import BACKWARD_ENGINES, ENGINES, PARTIAL_TILES
from maskc.runs import MAX_TILES
from maskc.progress import status

TILE = click.IntRange(1, INT32)     # a tile side: positive, and like every length an int32


class _Target(click.ParamType):
    """A build target as Options(arch=...) takes it (schedule.check_target): one of ARCHES or compute_XY (XY of
    schedule.PTX_CAPABILITIES)."""

    name = "target"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            check_target(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)
        return value

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(ARCHES) + "|compute_XY]"


_load = load_mask                       # the name tests replace to reach the internal-error path


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Python warnings from maskc (the disk cache's, say) as one plain line on stderr, without the code."""
    click.echo(f"warning: {message}", err=True)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except MaskError as err:
            click.echo(str(err), err=True)
            ctx.exit(1)
        except BrokenPipeError:              # `maskc ... | head`: the reader left; stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(1)
        except Exception as err:   # a bug in maskc: say so plainly, without a traceback
            click.echo(f"maskc: internal error: {type(err).__name__}: {err}\n"
                       "  (a bug in maskc: please report it with the command line that caused it)", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="maskc", message="%(prog)s %(version)s")
def cli() -> None:
    """maskc: compile attention masks (.mask files) to tile maps, descriptors and CUDA kernels.

    \b
    Examples:
      maskc lint examples/*.mask
      maskc show examples/document.mask --seq-len 4096 --param docs=1000,3000,96
      maskc compile examples/causal.mask -o causal.cu --check
      maskc run examples/sliding_window.mask --seq-len 2048 --param window=256

    `maskc COMMAND --help` describes each command; the language is described in docs/.
    """


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="maskc")


cli.add_command(run_cmd)


# -- compile ----------------------------------------------------------------------------------

@cli.command("compile")
@click.argument("file")
@mask_option
@click.option("-o", "--output", default="-", show_default=True, help="where to write the CUDA source ('-': stdout)")
@head_dim_option
@dtype_option
@click.option("--block-m", type=TILE, help="query rows per CTA (default: the schedule's)")
@click.option("--block-n", type=TILE, help="keys per inner step (default: the schedule's)")
@click.option("--engine", type=click.Choice(sorted(set(ENGINES) | set(BACKWARD_ENGINES))),
              help="forward kernel: mma (mma.sync, any GPU) or, for Hopper and head dims 64/128/256, wgmma_tma "
                   "(copy engine, warp-specialized); with --backward the dK/dV kernel's: mma, wgmma or wgmma_tma "
                   "(Hopper's default: warp-specialized); "
                   "default: $MASKC_ENGINE ($MASKC_BWD_ENGINE), else the schedule's")
@click.option("--arch", type=_Target(),
              help="the GPU to build for: sm_80 (A100), sm_86, sm_89 (L40S), sm_90a (H100/H200), sm_100a (B200), "
                   "sm_120a; compute_XY (80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121): PTX the driver of a GPU "
                   "of that capability or newer compiles  [default: $MASKC_ARCH, else sm_90a]")
@click.option("--check", is_flag=True, help="also compile it with NVRTC (needs CuPy, not a GPU)")
@click.option("--backward", is_flag=True, help="write the backward kernels (dQ, dK, dV) instead of the forward")
@click.option("--token-order", "token_order", metavar="ROWSxCOLS",
              help="the kernels of the mask rewritten in patches of ROWS x COLS image tokens (a mask over an image: "
                   "what maskc.attention runs where Options(token_order=...) picks that order); default: raster")
@click.option("--partial-tiles", "partial_tiles", type=click.Choice(PARTIAL_TILES),
              help="how the wgmma_tma forward (and --backward) masks PARTIAL tiles of exact masks with chunked "
                   "regions: bits (interval bit words per row), elements (the mask's test per pair, hoisted by row and column), "
                   "stored (each tile's words built once per binding by the source's second kernel, then read), auto "
                   "(stored where it applies, else bits) [default: $MASKC_PARTIAL_TILES, else auto]")
@import_path_option
@click.option("--param", "raw_params", multiple=True, metavar="NAME=VALUE",
              help="the value of a const parameter (compiled into the kernel; default: the file's); repeatable")
def compile_cmd(file: str, name: str | None, output: str, head_dim: str, dtype: str, block_m: int | None,
                block_n: int | None, engine: str | None, arch: str | None, check: bool, backward: bool,
                token_order: str | None, partial_tiles: str | None, raw_params: tuple[str, ...],
                import_paths: tuple[str, ...]) -> None:
    """Write the specialized CUDA forward kernel of a mask (or, with --backward, its backward kernels).

    A const parameter is compiled into the kernel: its value comes from --param, else from the default
    the file declares (`width: const int = 128`). The MASKC_* environment variables apply as at run
    time (README: Options and environment variables); the flags override them.

    \b
    Examples:
      maskc compile examples/causal.mask -o causal.cu --check
      maskc compile examples/clear.mask --param width=64 -o clear.cu
      maskc compile examples/document.mask --backward --head-dim 64 -o document_bwd.cu
      maskc compile examples/clear.mask --token-order 8x16 -o clear_8x16.cu --check
    """
    options = environment_options()
    if partial_tiles is not None:
        options = options.replace(partial_tiles=partial_tiles)
    mask = _load(file, name, import_paths)
    if output != "-":
        refuse_overwriting_sources(output, "-o", file, import_paths)
    given = parse_params(mask, raw_params)
    stray = sorted(set(given) - set(mask.const_params))
    if stray:
        raise CliError(f"only const parameters are compiled in; {', '.join(stray)} "
                       f"{'is' if len(stray) == 1 else 'are'} bound at run time")
    constants = mask.const_values(given)
    if backward and (block_m or block_n):
        raise CliError("--block-m/--block-n shape the forward kernel; the backward's tiles come from its schedule")
    if token_order is not None:
        from maskc.ordered import in_order
        try:
            mask = in_order(mask, token_order, constants)
        except ValueError as err:
            raise CliError(str(err)) from None
    try:
        if backward:
            src = mask.backward_source(options, head_dim=int(head_dim), dtype=dtype, constants=constants,
                                       engine=engine, arch=arch)
        else:
            src = mask.kernel_source(options, head_dim=int(head_dim), dtype=dtype, block_m=block_m, block_n=block_n,
                                     constants=constants, engine=engine, arch=arch)
    except ValueError as err:                        # the templates' limits on tile shapes and head dims
        raise CliError(str(err)) from None
    spec: Any = src.spec          # the forward's KernelSpec or the backward's BackwardSpec
    checked = _check_with_nvrtc(src) if check else None      # before writing: a failed check leaves -o as it was
    write_output(output, src.source)
    where = output if output != "-" else "stdout"
    if backward:
        click.echo(f"{where}: {', '.join(src.functions)} (head_dim {spec.head_dim}, {spec.dtype}, "
                   f"{spec.block_m} queries x {spec.block_n} keys per dK/dV tile, {spec.engine})", err=True)
    else:
        click.echo(f"{where}: {src.entry} (head_dim {spec.head_dim}, {spec.dtype}, "
                   f"BLOCK_M {spec.block_m}, BLOCK_N {spec.block_n}, {spec.num_warps} warps, {spec.engine})", err=True)
    if checked:
        click.echo(checked, err=True)


def _check_with_nvrtc(src) -> str:
    """NVRTC's verdict on ``src`` as the line to print (a CliError when it does not compile)."""
    from maskc.codegen.emit import KernelCompileError, compile_to_cubin, is_ptx
    from maskc.runtime.cpu_check import cubin_registers_by_kernel
    try:
        with status(f"NVRTC: compiling {', '.join(src.functions)}"):
            cubin = compile_to_cubin(src)
    except ImportError:
        raise CliError("--check needs CuPy's NVRTC: pip install 'maskc[cuda]'") from None
    except KernelCompileError as err:
        raise CliError(str(err)) from None
    if is_ptx(src):            # a compute_XY target: the driver compiles the PTX on the GPU at hand
        return f"NVRTC: ok, {len(cubin)} bytes of PTX"
    regs = cubin_registers_by_kernel(cubin)
    per_kernel = ", ".join(f"{regs[e]} ({e})" for e in src.functions if e in regs)
    return f"NVRTC: ok, {len(cubin)} byte cubin" + (f"; registers per thread: {per_kernel}" if regs else "")


# -- lint -------------------------------------------------------------------------------------

@cli.command("lint")
@click.argument("files", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github"]), default="text", show_default=True,
              help="text: file:line:col with the line and a caret; json: a list of objects; github: annotations "
                   "for a GitHub Actions log")
@click.option("--strict", is_flag=True, help="exit 1 on warnings too")
@import_path_option
def lint_cmd(files: tuple[str, ...], fmt: str, strict: bool, import_paths: tuple[str, ...]) -> None:
    """Report every error and likely mistake in .mask files.

    Errors: every block that does not parse and every rule that does not resolve, in every file and in every
    mask of the files they import (called or not).
    Warnings: unused parameters, allow rules that never hold or that deny rules cancel, deny rules that
    remove nothing, and rules whose keys per row maskc cannot compute exactly, so their tiles are not exact
    (k in a product, outside a disc, or in floors with no common chunk; k through // and % by divisors
    known at bind is exact). Exits 1 on an error (with --strict, on a warning too).

    \b
    Examples:
      maskc lint examples/*.mask
      maskc lint --format github masks/*.mask      # in a GitHub Actions step
    """
    from maskc.lint import Diagnostic, lint_file, render
    # A file that several of FILES import (or that is one of them) is reported once: imports are named by their
    # resolved path, FILES as given, so they are compared resolved.
    seen: dict[tuple, Diagnostic] = {}
    for f in files:
        for d in lint_file(f, import_paths):
            seen.setdefault((_resolved(d.file), d.line, d.col, d.severity, d.message), d)
    diags = list(seen.values())
    click.echo(render(diags, fmt), nl=False)
    errors = sum(d.severity == "error" for d in diags)
    warnings = len(diags) - errors
    if fmt == "text":
        click.echo(f"{len(files)} file(s): {errors} error(s), {warnings} warning(s)", err=True)
    if errors or (strict and warnings):
        sys.exit(1)


def _resolved(path: str) -> str:
    """The path with its symlinks resolved, where it can be (not with a NUL byte in it: as given)."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


# -- show and explain -------------------------------------------------------------------------

DENSE_TEXT_MAX = 160        # one character per pair: wider than this cannot be read in a terminal
DENSE_PNG_MAX = 2048        # per-pair overlay in the PNG up to this many queries/keys


@cli.command("show")
@click.argument("file")
@mask_option
@seq_len_option
@kv_len_option
@param_option
@click.option("--heads", type=click.IntRange(min=1), default=1, help="for masks that read h")
@click.option("--block-m", type=TILE, default=128, show_default=True, help="query rows per tile")
@click.option("--block-n", type=TILE, default=128, show_default=True, help="keys per tile")
@click.option("--png", type=click.Path(dir_okay=False), help="also write a picture")
@click.option("--dense", is_flag=True, help=f"draw every (q, k) pair (up to {DENSE_TEXT_MAX})")
@import_path_option
def show_cmd(file: str, name: str | None, seq_len: int, kv_len: int | None, params: tuple[str, ...], heads: int,
             block_m: int, block_n: int, png: str | None, dense: bool, import_paths: tuple[str, ...]) -> None:
    """Draw the tile classes of a bound mask (batch element 0).

    \b
    Examples:
      maskc show examples/causal.mask --seq-len 8 --block-m 2 --block-n 2 --dense
      maskc show examples/document.mask --seq-len 4096 --param docs=1000,3000,96 --png document.png
    """
    from maskc.show import render_dense, render_png, render_tiles
    mask = _load(file, name, import_paths)
    if png:
        refuse_overwriting_sources(png, "--png", file, import_paths)
    bound = bind_from_cli(mask, seq_len, kv_len, params, heads)
    _check_drawable(bound, block_m, block_n)
    if dense and max(bound.seq_len, bound.kv_len) > DENSE_TEXT_MAX:    # refused before any drawing
        raise CliError(f"--dense draws one character per pair: at most {DENSE_TEXT_MAX} queries and keys")
    classes = bound.tiles(block_m, block_n)
    click.echo(f"mask {mask.name}, seq_len {bound.seq_len}, kv_len {bound.kv_len}"
               + (f" (batch element 0 of {bound.batch})" if bound.batch > 1 else ""))
    click.echo(render_tiles(classes, block_m, block_n))
    if dense:
        click.echo(render_dense(bound.dense()))
    if png:
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise CliError("--png needs pillow: pip install 'maskc[png]'") from None
        small = max(bound.seq_len, bound.kv_len) <= DENSE_PNG_MAX
        try:
            with replacing(png) as temporary:
                render_png(classes, temporary, block_m, block_n, dense=bound.dense() if small else None,
                           title=f"{mask.name}  seq_len={bound.seq_len}  kv_len={bound.kv_len}  "
                                 f"tiles {block_m}x{block_n}")
        except OSError as err:
            raise CliError(f"cannot write {png}: {err.strerror or err}") from None
        click.echo(f"wrote {png}", err=True)


SUGGESTED_TILES = 1 << 20


def _check_drawable(bound, block_m: int, block_n: int) -> None:
    """show draws from the dense grid of tile classes, which the API refuses past MAX_TILES tiles with advice for
    Python; here the same refusal says what to type instead: tiles large enough (the drawing is scaled down to
    the terminal either way, so larger tiles lose nothing a terminal shows)."""
    def tiles(m: int, n: int) -> int:
        return bound.batch * -(-bound.seq_len // m) * -(-bound.kv_len // n)

    if tiles(block_m, block_n) <= MAX_TILES:
        return
    factor = 2                          # to a grid that draws in a second (2**20 tiles), not just one under the cap
    while tiles(block_m * factor, block_n * factor) > SUGGESTED_TILES and max(block_m, block_n) * factor < INT32:
        factor *= 2
    m, n = min(block_m * factor, INT32), min(block_n * factor, INT32)
    batch = f", batch {bound.batch}" if bound.batch > 1 else ""
    raise BindError(f"maskc show draws every tile, and {tiles(block_m, block_n)} tiles of {block_m} x {block_n} "
                    f"(seq_len {bound.seq_len}, kv_len {bound.kv_len}{batch}) are past {MAX_TILES} (2**28)",
                    hint=f"draw larger tiles, e.g. --block-m {m} --block-n {n} (the drawing is scaled to the "
                         "terminal anyway), or pass a shorter --seq-len")


@cli.command("explain")
@click.argument("file")
@mask_option
@click.option("--seq-len", type=click.IntRange(min=1), help="also bind it and show tiles and descriptor")
@kv_len_option
@param_option
@click.option("--heads", type=click.IntRange(min=1), default=1, help="for masks that read h")
@click.option("--block-m", type=TILE, default=128, show_default=True, help="query rows per tile")
@click.option("--block-n", type=TILE, default=128, show_default=True, help="keys per tile")
@head_dim_option
@dtype_option
@import_path_option
def explain_cmd(file: str, name: str | None, seq_len: int | None, kv_len: int | None, params: tuple[str, ...],
                heads: int, block_m: int, block_n: int, head_dim: str, dtype: str,
                import_paths: tuple[str, ...]) -> None:
    """Print each compiler stage's output for the masks of a file.

    parse, resolve, normalize, ranges and token order always; the kernel's stages (predicate, schedule,
    emit) for the given head dim and dtype; with --seq-len also bind, classify and pack.

    \b
    Examples:
      maskc explain examples/causal.mask
      maskc explain examples/prefix_lm.mask --seq-len 512 --param prefix=100
    """
    from maskc.explain import explain
    from maskc.pipeline import compile_all, load_program
    options = environment_options()
    masks = (_load(file, name, import_paths),) if name else compile_all(file, import_paths)
    bounds = {}
    if seq_len is None and (params or kv_len):
        raise click.UsageError("--param and --kv-len need --seq-len")
    if seq_len is not None:
        declared = {p.name for m in masks for p in m.params}
        unknown = [p.partition("=")[0] for p in params if p.partition("=")[0].strip() not in declared]
        if unknown and len(masks) > 1:
            raise click.BadParameter(f"no mask of {file} has a parameter {unknown[0]!r}", param_hint="'--param'")
        for m in masks:
            mine = tuple(p for p in params if p.partition("=")[0].strip() in {q.name for q in m.params}
                         or len(masks) == 1)
            bounds[m.name] = bind_from_cli(m, seq_len, kv_len, mine, heads)
    text = explain(load_program(file, import_paths).main, masks, bounds, block_m, block_n, head_dim=int(head_dim),
                   dtype=dtype, options=options)
    click.echo(text, nl=False)


# -- cache ------------------------------------------------------------------------------------

@cli.group("cache", cls=click.Group)
def cache_group() -> None:
    """The disk cache of compiled kernels (cubins) and autotuning results.

    It lives in $MASKC_CACHE_DIR, else $XDG_CACHE_HOME/maskc, else ~/.cache/maskc. Entries are keyed by
    a hash of the kernel source, the compiler's options and versions: a stale entry is never used, so
    clearing is only ever needed to reclaim disk space. A cache that cannot be written is skipped with
    one warning.

    \b
    Examples:
      maskc cache info
      maskc cache clear
    """


def _size(total: int) -> str:
    return f"{total / 2 ** 20:.1f} MiB" if total >= 2 ** 20 else f"{total / 1024:.1f} KiB"


@cache_group.command("info")
def cache_info_cmd() -> None:
    """Where the cache is, and what it holds.

    \b
    Example:
      maskc cache info
    """
    from maskc.runtime import cache
    from maskc.runtime.loader import disk_cache
    disk = disk_cache(environment_options())
    if disk.root is None:
        click.echo("cache directory: none ($HOME is empty or '/'; set MASKC_CACHE_DIR): kernels are compiled "
                   "in every process")
        return
    try:
        files = disk.files()
        kernels = [p for p in files if p.name != cache.TUNING_FILE and p.suffix != ".tmp"]
        tuned = [p for p in files if p.name == cache.TUNING_FILE]
        sizes = {p: p.stat().st_size for p in files}
        click.echo(f"cache directory: {disk.root}" + ("" if disk.root.is_dir() else " (not created yet)"))
        click.echo(f"compiled kernels: {len(kernels)} cubin(s), {_size(sum(sizes[p] for p in kernels))}")
        click.echo(f"autotuning results: {'yes' if tuned else 'none'}" +
                   (f", {_size(sizes[tuned[0]])}" if tuned else ""))
        click.echo(f"total: {len(files)} file(s), {_size(sum(sizes.values()))}")
    except OSError as err:
        raise CliError(f"cannot read the cache: {err.strerror or err}") from None


@cache_group.command("clear")
def cache_clear_cmd() -> None:
    """Delete the cached kernels and autotuning results (they are rebuilt on next use).

    \b
    Example:
      maskc cache clear
    """
    from maskc.runtime import cache
    from maskc.runtime.loader import disk_cache
    disk = disk_cache(environment_options())
    try:
        count, size = disk.clear()
    except OSError as err:
        raise CliError(f"cannot clear the cache: {err.strerror or err}") from None
    click.echo(f"removed {count} file(s), {_size(size)}, from {disk.root or 'no cache directory'}")


__all__ = ["cli", "main", "parse_params", "gpu_available", "CliError"]
