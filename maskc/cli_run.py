"""``maskc run``: masked attention on random inputs, held against the float64 reference.

On a GPU it runs maskc's kernel; without one, a float32 pass that walks the descriptor's tiles like the
kernel does. Either way the result is compared with the dense float64 reference, and the command exits
1 when the relative error is above the tolerance: a wrong kernel never passes silently.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import click
import numpy as np

from maskc.cli_shared import (DEFAULT_DTYPE, CliError, bind_from_cli, dtype_option, environment_options, gpu_available,
                              head_dim_option, import_path_option, kv_len_option, load_mask, mask_option, param_option,
                              seq_len_option)
from maskc.errors import MaskError
from maskc.progress import status

CPU_MAX_LEN = 8192          # the float64 reference is O(S*K*D) per head: beyond this it takes minutes
CPU_MAX_WORK = 2 ** 35      # batch * heads * seq_len * kv_len * head_dim: tens of seconds of the float64 reference
CPU_MAX_ELEMENTS = 2 ** 27  # batch * heads * length * head_dim per input array: 512 MiB of float32
# ‖out − ref‖ / ‖ref‖ above which `run` exits 1: the kernel's (bf16/fp16 inputs and output, fp32 sums), and
# the CPU's float32 tile walk. The GPU test suite holds the kernels to the same bounds.
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3, "cpu": 1e-4}
GRAD_TOLERANCE = {"bf16": 2e-2, "fp16": 1e-2, "cpu": 1e-4}


def _timed(what: str, step: Callable[[], Any]) -> tuple[Any, float]:
    with status(what):
        start = time.perf_counter()
        result = step()
    return result, time.perf_counter() - start


def _run_gpu(bound, q, k, v, dtype, options):
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

    def first():
        result = maskc.attention(tq, tk, tv, bound, options=options)
        sync()
        return result
    out, _ = _timed("compiling the kernel with NVRTC (cached for later runs)", first)
    start, iters = time.perf_counter(), 10
    for _ in range(iters):
        maskc.attention(tq, tk, tv, bound, options=options)
    sync()
    host = out.float().cpu().numpy() if hasattr(out, "cpu") else out.get().astype(np.float32)
    return host, (time.perf_counter() - start) / iters


def _verdict(name: str, err: float, limit: float, what: str) -> bool:
    ok = bool(err <= limit)
    click.echo(f"‖{name} − ref‖ / ‖ref‖ = {err:.3e}  ({what}, vs float64): "
               + ("ok" if ok else f"MISMATCH (tolerance {limit:.0e})"))
    return ok


def _not_nan(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """click's ranges let nan through (every comparison with it is false): as a tolerance every result would fail."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a tolerance: give a positive number such as 1e-3")
    return value


@click.command("run")
@click.argument("file")
@mask_option
@seq_len_option
@kv_len_option
@param_option
@click.option("--heads", type=click.IntRange(min=1), default=4, show_default=True, help="query heads")
@head_dim_option
@dtype_option
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="of the random inputs")
@click.option("--tolerance", type=click.FloatRange(min=0, min_open=True), callback=_not_nan,
              help="largest relative error that passes (default: 1e-2 bf16, 5e-3 fp16 on the GPU; 1e-4 on the "
                   "CPU; gradients twice that on the GPU)")
@click.option("--backward", is_flag=True, help="also check the backward (dQ, dK, dV; on the GPU through torch)")
@import_path_option
def run_cmd(file, name, seq_len, kv_len, params, heads, head_dim, dtype, batch, seed, tolerance,
            backward, import_paths):
    """Run masked attention on random inputs and compare it with the float64 reference.

    On a GPU it runs maskc's kernel (compiled on first use, then cached); without one, a float32 pass
    that walks the descriptor's tiles as the kernel does. Exits 1 when the result differs from the
    reference by more than the tolerance.

    \b
    Examples:
      maskc run examples/causal.mask --seq-len 1024
      maskc run examples/document.mask --seq-len 2048 --param docs=500,1000,548 --backward
      maskc run examples/hstu.mask --seq-len 512 --param 'users=200,312;512' --param 'targets=20,30;40'
    """
    from maskc.codegen.schedule import choose_tiles
    from maskc.runtime.cpu_check import relative_error, round_to
    from maskc.runtime.reference import reference_attention

    options = environment_options()
    mask = load_mask(file, name, import_paths)
    bound = bind_from_cli(mask, seq_len, kv_len, params, heads)
    if bound.batch > 1 and batch not in (1, bound.batch):
        raise CliError(f"the parameters describe {bound.batch} batch elements, but --batch is {batch}")
    batch = max(batch, bound.batch)
    dim = int(head_dim)
    try:
        block_m, block_n = choose_tiles(dim, dtype, engine=options.engine)[:2]
    except ValueError as err:
        raise CliError(str(err)) from None
    on_gpu = gpu_available()
    longest = max(bound.seq_len, bound.kv_len)
    work = batch * heads * bound.seq_len * bound.kv_len * dim
    if batch * heads * longest * dim > CPU_MAX_ELEMENTS:
        raise CliError(f"batch {batch} x {heads} heads x length {longest} x head_dim {dim} random inputs would take "
                       f"more than {CPU_MAX_ELEMENTS * 4 // 2 ** 20} MiB each; use a smaller --batch, --heads or "
                       "--seq-len")
    if not on_gpu and (longest > CPU_MAX_LEN or work > CPU_MAX_WORK):
        raise CliError(f"no GPU found, and batch {batch} x {heads} heads x seq_len {bound.seq_len} x kv_len "
                       f"{bound.kv_len} is too large for the CPU reference (lengths at most {CPU_MAX_LEN}, "
                       f"at most 2**35 multiply-adds); use a smaller --seq-len, --heads or --batch")
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((batch, heads, n, dim), np.float32), dtype)
               for n in (bound.seq_len, bound.kv_len, bound.kv_len))
    click.echo(f"mask {mask.name}: batch {batch}, {heads} heads, seq_len {bound.seq_len}, kv_len {bound.kv_len}, "
               f"head_dim {dim}, {dtype} inputs")
    click.echo(_tile_summary(bound, block_m, block_n))
    ordered = _token_order(bound, options)
    click.echo(_order_summary(ordered, options, block_m, block_n))
    ok = True
    if on_gpu:
        out, seconds = _run_gpu(bound, q, k, v, dtype, options)
        pairs = _visible_pairs(bound)
        # 4 flops per visible pair and head dim element (QK^T and PV); batch-1 masks repeat over the batch
        rate = "" if pairs is None else (
            f", {4.0 * pairs * (batch // bound.batch) * heads * dim / seconds / 1e12:.1f} TFLOP/s on visible pairs")
        click.echo(f"GPU: maskc kernel {seconds * 1e3:.3f} ms per call (wall clock, mean of 10){rate}")
        if longest > CPU_MAX_LEN or work > CPU_MAX_WORK:
            click.echo(f"reference skipped: lengths above {CPU_MAX_LEN} or more than 2**35 multiply-adds take too "
                       "long on the CPU (the result is not checked)")
            return
        ref, seconds = _timed("float64 reference on the CPU", lambda: reference_attention(q, k, v, bound))
        click.echo(f"float64 reference (CPU): {seconds:.3f} s")
        ok = _verdict("out", relative_error(out, ref), tolerance or TOLERANCE[dtype], f"maskc kernel, {dtype}")
        if backward:
            ok = _run_backward(bound, q, k, v, dtype, rng, "cuda", tolerance, options) and ok
    else:
        click.echo("no GPU found: ran the CPU reference instead of maskc's kernel (numpy float64 dense, checked "
                   "against a float32 pass that walks the descriptor's tiles)")
        ref, seconds = _timed("float64 dense reference", lambda: reference_attention(q, k, v, bound))
        click.echo(f"float64 dense reference: {seconds:.3f} s")
        out, seconds = _timed("float32 tile-skipping reference",
                              lambda: _blocked_in_order(q, k, v, bound, ordered, block_m, block_n))
        click.echo(f"float32 tile-skipping reference: {seconds:.3f} s")
        ok = _verdict("out", relative_error(out, ref), tolerance or TOLERANCE["cpu"], "float32 tile-skipping")
        if backward:
            ok = _run_backward(bound, q, k, v, dtype, rng, "cpu", tolerance, options) and ok
    if not ok:
        raise CliError("the result differs from the float64 reference by more than the tolerance")


def _run_backward(bound, q, k, v, dtype, rng, device: str, tolerance: float | None, options) -> bool:
    """Gradients against the float64 textbook backward: on CUDA through maskc.attention's autograd (the
    backward kernels; needs torch), on the CPU by the float32 pass that walks the descriptor's transposed
    runs like the dK/dV kernel. True when all three agree within the tolerance."""
    from maskc.codegen.schedule import choose_backward_tiles
    from maskc.runtime.cpu_check import blocked_attention_backward, relative_error, round_to
    from maskc.runtime.reference import reference_attention_backward

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

        def step():
            return torch.autograd.grad(maskc.attention(tq, tk, tv, bound, options=options), (tq, tk, tv), tdo)

        def first():
            result = [g.float().cpu().numpy() for g in step()]
            torch.cuda.synchronize()
            return result
        grads, _ = _timed("compiling the backward kernels with NVRTC (cached for later runs)", first)
        start, iters = time.perf_counter(), 10
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        click.echo(f"GPU: forward + backward {(time.perf_counter() - start) / iters * 1e3:.3f} ms per step "
                   "(autograd, wall clock, mean of 10)")
        what, limit = f"maskc backward kernels, {dtype}", tolerance or GRAD_TOLERANCE[dtype]
    else:
        try:
            tiles = choose_backward_tiles(q.shape[-1], dtype, engine=options.backward_engine)
        except ValueError as err:
            raise CliError(str(err)) from None
        grads, seconds = _timed("float32 backward", lambda: blocked_attention_backward(
            q, k, v, dout, bound, tiles.block_m, tiles.block_n))
        click.echo(f"float32 backward walking the transposed tiles: {seconds:.3f} s")
        what, limit = "float32 tile-walking backward", tolerance or GRAD_TOLERANCE["cpu"]
    refs = reference_attention_backward(q, k, v, dout, bound)
    results = [_verdict(name, relative_error(got, ref), limit, what)
               for name, got, ref in zip(("dq", "dk", "dv"), grads, refs)]
    return all(results)


def _tile_summary(bound, block_m: int, block_n: int) -> str:
    from maskc.show import legend
    tiles = bound.tile_map(block_m, block_n)
    exact = "exact" if tiles.exact else "sound, not exact (some PARTIAL tiles may be full or empty)"
    lines = [f"tiles {block_m}x{block_n}: {legend(tiles.counts())}", f"tile classes: {exact}"]
    pairs = _visible_pairs(bound)
    if pairs is not None:
        total = bound.batch * bound.seq_len * bound.kv_len
        lines.append(f"density: {pairs} of {total} (q, k) pairs visible ({100.0 * pairs / total:.2f}%)")
    return "\n".join(lines)


def _token_order(bound, options):
    """The token order a call takes (:mod:`maskc.ordered`; None: raster), or the CliError of one asked for
    that the mask does not admit."""
    from maskc.ordered import token_order
    try:
        return token_order(bound, options)
    except MaskError as err:
        raise CliError(err.message) from None


def _order_summary(ordered, options, block_m: int, block_n: int) -> str:
    """The token order the run takes and its tiles."""
    from maskc.show import legend
    if ordered is None:
        return f"token order: raster ({options.token_order})"
    return (f"token order: {ordered.order} ({options.token_order}): tiles {block_m}x{block_n} "
            f"{legend(ordered.inner.tile_map(block_m, block_n).counts())}")


def _blocked_in_order(q, k, v, bound, ordered, block_m: int, block_n: int):
    """The float32 tile-skipping pass, in the token order when there is one (its tiles are the order's, as the
    kernel's are): q, k and v moved into it, the output moved back."""
    from maskc.runtime.cpu_check import blocked_attention
    if ordered is None:
        return blocked_attention(q, k, v, bound, block_m, block_n)
    into, back = ordered.permutation, ordered.inverse
    return blocked_attention(q[:, :, into], k[:, :, into], v[:, :, into], ordered.inner, block_m,
                             block_n)[:, :, back]


def _visible_pairs(bound) -> int | None:
    """Visible pairs over the batch (head 0): exact masks count rows' intervals, others the dense mask
    when it is small; None when neither is cheap."""
    try:
        return bound.visible_pairs()
    except NotImplementedError:            # visible_pairs handles exact masks only
        if bound.seq_len * bound.kv_len > CPU_MAX_LEN ** 2:
            return None
        return int(sum(bound.dense(b).sum() for b in range(bound.batch)))


__all__ = ["run_cmd", "TOLERANCE", "GRAD_TOLERANCE", "DEFAULT_DTYPE"]
