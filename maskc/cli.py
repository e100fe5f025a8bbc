"""The ``maskc`` command: a thin shell over the Python API (compile, run, lint, show, explain).

Every :class:`~maskc.errors.MaskError` is printed as ``file:line:col: error: ...`` with its caret and
exits 1; an unexpected exception prints ``maskc: internal error: ...`` and exits 2. No traceback
ever reaches the user. The GPU is optional: it is looked for, never assumed.
"""
from __future__ import annotations

import json
import os
import sys
import time

import click
import numpy as np

from .errors import MaskError
from .kernel_ir import ENGINES

CPU_MAX_LEN = 8192          # the float64 reference is O(S*K*D) per head: beyond this it takes minutes


class CliError(click.ClickException):
    """A problem with the command line or the machine, not the mask: ``maskc: error: ...``, exit 1."""

    exit_code = 1

    def show(self, file=None):
        click.echo(f"maskc: error: {self.message}", err=True)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
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
            click.echo(f"maskc: internal error: {type(err).__name__}: {err}", err=True)
            ctx.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="maskc", prog_name="maskc")
def cli():
    """maskc: compile attention masks (.mask files) to tile maps, descriptors and CUDA kernels."""


def main(argv=None):
    cli.main(args=argv, prog_name="maskc")


# -- shared helpers ---------------------------------------------------------------------------

def gpu_available() -> bool:
    """Whether CuPy sees a CUDA device (False without CuPy, a driver or a GPU)."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _load(path: str, name: str | None):
    from .pipeline import load
    return load(path, name)


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{what}: expected integers separated by ',', got {text!r}",
                                 param_hint="'--param'") from None


def parse_params(mask, raw: tuple[str, ...]) -> dict:
    """``name=value`` strings to bind's keyword arguments: an int, or a comma list for segments and
    per arrays; ``;`` separates batch elements (jagged batches)."""
    kinds = {p.name: p.kind for p in mask.params}
    values = {}
    for item in raw:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: expected name=value", param_hint="'--param'")
        elements = []
        for part in text.split(";"):
            nums = _ints(part, name)
            if kinds.get(name) == "int" or (name not in kinds and "," not in part):
                if len(nums) != 1:
                    raise click.BadParameter(f"{name} is an int: give one integer per batch element, "
                                             f"got {part!r}", param_hint="'--param'")
                elements.append(nums[0])
            else:
                elements.append(nums)
        values[name] = elements if len(elements) > 1 else elements[0]
    return values


def _bind(mask, seq_len, kv_len, raw_params, heads):
    # Only a mask that reads h is bound per head (else every head shares one mask).
    return mask.bind(seq_len=seq_len, kv_len=kv_len, num_heads=heads if mask.ranges.uses_head else None,
                     **parse_params(mask, raw_params))


def _tile_summary(bound, block_m, block_n) -> str:
    from .show import legend, tile_counts
    tiles = bound.tile_map(block_m, block_n)
    exact = "exact" if tiles.exact else "sound, not exact (some PARTIAL tiles may be full or empty)"
    lines = [f"tiles {block_m}x{block_n}: {legend(tile_counts(tiles.classes))}", f"tile classes: {exact}"]
    pairs = _visible_pairs(bound)
    if pairs is not None:
        total = bound.batch * bound.seq_len * bound.kv_len
        lines.append(f"density: {pairs} of {total} (q, k) pairs visible ({100.0 * pairs / total:.2f}%)")
    return "\n".join(lines)


def _visible_pairs(bound) -> int | None:
    """Visible pairs over the batch (head 0): exact masks count rows' intervals, others the dense mask
    when it is small; None when neither is cheap."""
    try:
        return bound.visible_pairs()
    except NotImplementedError:            # visible_pairs handles exact masks only
        if bound.seq_len * bound.kv_len > CPU_MAX_LEN ** 2:
            return None
        return int(sum(bound.dense(b).sum() for b in range(bound.batch)))


mask_option = click.option("-m", "--mask", "name", help="which mask, when the file defines several")
param_option = click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
                            help="a parameter: 7, or 100,200,724 for segments; ';' between batch elements")
seq_len_option = click.option("--seq-len", type=click.IntRange(min=1), required=True)
kv_len_option = click.option("--kv-len", type=click.IntRange(min=1), help="key length (default: seq_len)")


# -- compile ----------------------------------------------------------------------------------

@cli.command("compile")
@click.argument("file")
@mask_option
@click.option("-o", "--output", default="-", help="where to write the CUDA source ('-': stdout)")
@click.option("--head-dim", type=click.Choice(["64", "128", "256"]), default="128")
@click.option("--dtype", type=click.Choice(["bf16", "fp16"]), default="bf16")
@click.option("--block-m", type=int, help="query rows per CTA (default: the schedule's)")
@click.option("--block-n", type=int, help="keys per inner step (default: the schedule's)")
@click.option("--engine", type=click.Choice(list(ENGINES)),
              help="forward kernel: mma (mma.sync, any head dim), or for Hopper and head dims 64/128 wgmma "
                   "(cp.async loads) or wgmma_tma (copy engine, warp-specialized); with --backward the dK/dV "
                   "kernel's: mma or wgmma; default: the schedule's")
@click.option("--check", is_flag=True, help="also compile it with NVRTC (needs CuPy, not a GPU)")
@click.option("--backward", is_flag=True, help="write the backward kernels (dQ, dK, dV) instead of the forward")
@click.option("--param", "raw_params", multiple=True, metavar="NAME=VALUE",
              help="the value of a const parameter (compiled into the kernel); repeatable")
def compile_cmd(file, name, output, head_dim, dtype, block_m, block_n, engine, check, backward, raw_params):
    """Write the specialized CUDA forward kernel of a mask (or, with --backward, its backward kernels)."""
    mask = _load(file, name)
    given = parse_params(mask, raw_params)
    stray = sorted(set(given) - set(mask.const_params))
    if stray:
        raise CliError(f"only const parameters are compiled in; {', '.join(stray)} "
                       f"{'is' if len(stray) == 1 else 'are'} bound at run time")
    constants = tuple((n, given[n]) for n in mask.const_params if n in given)
    if backward and (block_m or block_n):
        raise CliError("--block-m/--block-n shape the forward kernel; the backward's tiles come from its schedule")
    try:
        if backward:
            from .emit import emit_backward_kernel
            src = emit_backward_kernel(mask.backward_spec(head_dim=int(head_dim), dtype=dtype, constants=constants,
                                                          engine=engine))
        else:
            src = mask.kernel_source(head_dim=int(head_dim), dtype=dtype, block_m=block_m, block_n=block_n,
                                     constants=constants, engine=engine)
    except ValueError as err:                        # the templates' limits on tile shapes and head dims
        raise CliError(str(err)) from None
    spec = src.spec
    if output == "-":
        click.echo(src.source, nl=False)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(src.source)
    where = output if output != "-" else "stdout"
    if backward:
        click.echo(f"{where}: {', '.join(src.functions)} (head_dim {spec.head_dim}, {spec.dtype}, "
                   f"{spec.block_m} queries x {spec.block_n} keys per dK/dV tile, {spec.engine})", err=True)
    else:
        click.echo(f"{where}: {src.entry} (head_dim {spec.head_dim}, {spec.dtype}, "
                   f"BLOCK_M {spec.block_m}, BLOCK_N {spec.block_n}, {spec.num_warps} warps, {spec.engine})", err=True)
    if check:
        from .emit import KernelCompileError, compile_to_cubin
        try:
            cubin = compile_to_cubin(src)
        except ImportError:
            raise CliError("--check needs CuPy's NVRTC: pip install 'maskc[cuda]'") from None
        except KernelCompileError as err:
            raise CliError(str(err)) from None
        from .cpu_check import cubin_registers_by_kernel
        regs = cubin_registers_by_kernel(cubin)
        per_kernel = ", ".join(f"{regs[e]} ({e})" for e in src.functions if e in regs)
        click.echo(f"NVRTC: ok, {len(cubin)} byte cubin" + (f"; registers per thread: {per_kernel}" if regs else ""),
                   err=True)


# -- run --------------------------------------------------------------------------------------

def _run_gpu(bound, q, k, v, dtype):
    import maskc
    try:
        import torch
        dev = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        tq, tk, tv = (torch.from_numpy(x).to("cuda", dev) for x in (q, k, v))
        sync = torch.cuda.synchronize
    except ImportError:
        import cupy
        if dtype == "bf16":
            raise CliError("bf16 inputs need torch on the GPU path; use --dtype fp16") from None
        tq, tk, tv = (cupy.asarray(x, cupy.float16) for x in (q, k, v))
        sync = cupy.cuda.Device().synchronize
    out = maskc.attention(tq, tk, tv, bound)     # the first call compiles (or loads the cubin)
    sync()
    start, iters = time.perf_counter(), 10
    for _ in range(iters):
        maskc.attention(tq, tk, tv, bound)
    sync()
    host = out.float().cpu().numpy() if hasattr(out, "cpu") else out.get().astype(np.float32)
    return host, (time.perf_counter() - start) / iters


@cli.command("run")
@click.argument("file")
@mask_option
@seq_len_option
@kv_len_option
@param_option
@click.option("--heads", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--head-dim", type=click.Choice(["64", "128", "256"]), default="64", show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--backward", is_flag=True, help="also check the backward (dQ, dK, dV; on the GPU through torch)")
def run_cmd(file, name, seq_len, kv_len, params, heads, head_dim, dtype, batch, seed, backward):
    """Run masked attention on random inputs and compare it with the float64 reference."""
    from .cpu_check import blocked_attention, relative_error, round_to
    from .reference import reference_attention
    from .schedule import choose_tiles

    mask = _load(file, name)
    bound = _bind(mask, seq_len, kv_len, params, heads)
    if bound.batch > 1 and batch not in (1, bound.batch):
        raise CliError(f"the parameters describe {bound.batch} batch elements, but --batch is {batch}")
    batch = max(batch, bound.batch)
    dim = int(head_dim)
    block_m, block_n = choose_tiles(dim, dtype)[:2]
    on_gpu = gpu_available()
    if not on_gpu and max(bound.seq_len, bound.kv_len) > CPU_MAX_LEN:
        raise CliError(f"no GPU found, and seq_len/kv_len {bound.seq_len}/{bound.kv_len} is too large for "
                       f"the CPU reference (at most {CPU_MAX_LEN}); use a smaller --seq-len")
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((batch, heads, n, dim), np.float32), dtype)
               for n in (bound.seq_len, bound.kv_len, bound.kv_len))
    click.echo(f"mask {mask.name}: batch {batch}, {heads} heads, seq_len {bound.seq_len}, kv_len {bound.kv_len}, "
               f"head_dim {dim}, {dtype} inputs")
    click.echo(_tile_summary(bound, block_m, block_n))
    if on_gpu:
        out, seconds = _run_gpu(bound, q, k, v, dtype)
        pairs = _visible_pairs(bound)
        # 4 flops per visible pair and head dim element (QK^T and PV); batch-1 masks repeat over the batch
        rate = "" if pairs is None else (
            f", {4.0 * pairs * (batch // bound.batch) * heads * dim / seconds / 1e12:.1f} TFLOP/s on visible pairs")
        click.echo(f"GPU: maskc kernel {seconds * 1e3:.3f} ms per call (wall clock, mean of 10){rate}")
        if max(bound.seq_len, bound.kv_len) > CPU_MAX_LEN:
            click.echo(f"reference skipped: seq_len/kv_len above {CPU_MAX_LEN} take too long on the CPU")
            return
        start = time.perf_counter()
        ref = reference_attention(q, k, v, bound)
        click.echo(f"float64 reference (CPU): {time.perf_counter() - start:.3f} s")
        click.echo(f"‖out − ref‖ / ‖ref‖ = {relative_error(out, ref):.3e}  (maskc kernel, {dtype}, vs float64)")
        if backward:
            _run_backward(bound, q, k, v, dtype, rng, device="cuda")
        return
    click.echo("no GPU found: ran the CPU reference instead of maskc's kernel (numpy float64 dense, checked "
               "against a float32 pass that walks the descriptor's tiles)")
    start = time.perf_counter()
    ref = reference_attention(q, k, v, bound)
    click.echo(f"float64 dense reference: {time.perf_counter() - start:.3f} s")
    start = time.perf_counter()
    out = blocked_attention(q, k, v, bound, block_m, block_n)
    click.echo(f"float32 tile-skipping reference: {time.perf_counter() - start:.3f} s")
    click.echo(f"‖out − ref‖ / ‖ref‖ = {relative_error(out, ref):.3e}  (float32 tile-skipping vs float64 dense)")
    if backward:
        _run_backward(bound, q, k, v, dtype, rng, device="cpu")


def _run_backward(bound, q, k, v, dtype, rng, device):
    """Gradients against the float64 textbook backward: on CUDA through maskc.attention's autograd (the
    backward kernels; needs torch), on the CPU by the float32 pass that walks the descriptor's transposed
    runs like the dK/dV kernel."""
    from .cpu_check import blocked_attention_backward, relative_error, round_to
    from .reference import reference_attention_backward
    from .schedule import choose_backward_tiles

    dout = round_to(rng.standard_normal(q.shape, np.float32), dtype)
    if device == "cuda":
        try:
            import torch
        except ImportError:
            raise CliError("--backward on the GPU needs torch (pip install torch)") from None
        import maskc
        kind = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        tq, tk, tv = (torch.from_numpy(x).to(device, kind).requires_grad_() for x in (q, k, v))
        tdo = torch.from_numpy(dout).to(device, kind)
        step = lambda: torch.autograd.grad(maskc.attention(tq, tk, tv, bound), (tq, tk, tv), tdo)  # noqa: E731
        grads = [g.float().cpu().numpy() for g in step()]     # the first call compiles (or loads) the kernels
        torch.cuda.synchronize()
        start, iters = time.perf_counter(), 10
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        click.echo(f"GPU: forward + backward {(time.perf_counter() - start) / iters * 1e3:.3f} ms per step "
                   "(autograd, wall clock, mean of 10)")
        what = f"maskc backward kernels, {dtype}"
    else:
        try:
            tiles = choose_backward_tiles(q.shape[-1], dtype)
            block_m, block_n = tiles.block_m, tiles.block_n
        except ValueError as err:
            raise CliError(str(err)) from None
        start = time.perf_counter()
        grads = blocked_attention_backward(q, k, v, dout, bound, block_m, block_n)
        click.echo(f"float32 backward walking the transposed tiles: {time.perf_counter() - start:.3f} s")
        what = "float32 tile-walking backward"
    refs = reference_attention_backward(q, k, v, dout, bound)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs):
        click.echo(f"‖{name} − ref‖ / ‖ref‖ = {relative_error(got, ref):.3e}  ({what}, vs float64)")


# -- lint -------------------------------------------------------------------------------------

def _github_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


@cli.command("lint")
@click.argument("files", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "github"]), default="text")
@click.option("--strict", is_flag=True, help="exit 1 on warnings too")
def lint_cmd(files, fmt, strict):
    """Report every error and likely mistake in .mask files."""
    from .lint import lint_file
    diags = [d for f in files for d in lint_file(f)]
    if fmt == "json":
        click.echo(json.dumps([d.as_dict() for d in diags], indent=2))
    for d in diags if fmt != "json" else ():
        if fmt == "github":
            message = d.message + (f" (hint: {d.hint})" if d.hint else "")
            click.echo(f"::{d.severity} file={_github_escape(d.file, True)},line={d.line},col={d.col}::"
                       f"{_github_escape(message)}")
        else:
            click.echo(str(d))
    errors = sum(d.severity == "error" for d in diags)
    warnings = len(diags) - errors
    if fmt == "text":
        click.echo(f"{len(files)} file(s): {errors} error(s), {warnings} warning(s)", err=True)
    if errors or (strict and warnings):
        sys.exit(1)


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
@click.option("--block-m", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--block-n", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--png", type=click.Path(dir_okay=False), help="also write a picture")
@click.option("--dense", is_flag=True, help=f"draw every (q, k) pair (up to {DENSE_TEXT_MAX})")
def show_cmd(file, name, seq_len, kv_len, params, heads, block_m, block_n, png, dense):
    """Draw the tile classes of a bound mask (batch element 0)."""
    from .show import render_dense, render_png, render_tiles
    mask = _load(file, name)
    bound = _bind(mask, seq_len, kv_len, params, heads)
    classes = bound.tiles(block_m, block_n)
    click.echo(f"mask {mask.name}, seq_len {bound.seq_len}, kv_len {bound.kv_len}"
               + (f" (batch element 0 of {bound.batch})" if bound.batch > 1 else ""))
    click.echo(render_tiles(classes, block_m, block_n))
    if dense:
        if max(bound.seq_len, bound.kv_len) > DENSE_TEXT_MAX:
            raise CliError(f"--dense draws one character per pair: at most {DENSE_TEXT_MAX} queries and keys")
        click.echo(render_dense(bound.dense()))
    if png:
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise CliError("--png needs pillow: pip install 'maskc[png]'") from None
        small = max(bound.seq_len, bound.kv_len) <= DENSE_PNG_MAX
        render_png(classes, png, block_m, block_n, dense=bound.dense() if small else None,
                   title=f"{mask.name}  seq_len={bound.seq_len}  kv_len={bound.kv_len}  tiles {block_m}x{block_n}")
        click.echo(f"wrote {png}", err=True)


@cli.command("explain")
@click.argument("file")
@mask_option
@click.option("--seq-len", type=click.IntRange(min=1), help="also bind it and show tiles and descriptor")
@kv_len_option
@param_option
@click.option("--heads", type=click.IntRange(min=1), default=1, help="for masks that read h")
@click.option("--block-m", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--block-n", type=click.IntRange(min=1), default=128, show_default=True)
def explain_cmd(file, name, seq_len, kv_len, params, heads, block_m, block_n):
    """Print each compiler stage's output for the masks of a file."""
    from .explain import explain
    from .pipeline import compile_all, load_program
    masks = (_load(file, name),) if name else compile_all(file)
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
            bounds[m.name] = _bind(m, seq_len, kv_len, mine, heads)
    click.echo(explain(load_program(file).main, masks, bounds, block_m, block_n), nl=False)
