"""maskc in PyTorch: custom ops with autograd, usable under ``torch.compile`` without graph breaks.

    out = maskc.attention(q, k, v, bound)          # torch tensors: differentiable
    out.backward(grad)                              # dQ, dK, dV from the generated backward kernels

Under torch.compile two ops carry the work: ``maskc::attention_forward`` (O and LSE) and
``maskc::attention_backward`` (dQ, dK, dV), each with a fake (meta) implementation so that torch.compile
traces shapes without running them, and tied together by ``register_autograd``. In eager mode the same
implementation runs as a ``torch.autograd.Function``: the custom ops' Python dispatch cost about 1 ms per
forward and backward (bench/bench_overhead.py, run 14), several times the kernels at a few thousand tokens.

The bound mask crosses the compiled graph as data: its handle (:mod:`maskc.runtime.handles`) in a 0-d int64
tensor, which torch.compile reads from the mask's ``handle_array`` as a tensor input and never guards by
value. A new bound mask every step (new document lengths, same shapes of q, k and v) so runs the same
compiled graph: no recompile, no graph break. Nothing else of the mask is read while tracing, so nothing
else is guarded; the ops look the mask up when they run (on the CPU: its dense reference; on the GPU: its
descriptor, built on the host). The
:class:`~maskc.options.Options` travel as their ``token`` (a string; ``""``: the environment's, read when the op
runs).

On CUDA tensors the ops run maskc's kernels (:mod:`maskc.runtime`). On CPU tensors they run the reference
path: the same mathematics as the kernels (the backward from LSE and delta = rowsum(dO * O), not autograd of
the forward) on the bound mask's dense form, in float32, or float64 for float64 inputs. That path is for
small sizes: tests (``torch.autograd.gradcheck``) and toy training on a machine without a GPU.
"""
from __future__ import annotations

import math
import weakref
from typing import Optional

import torch

from maskc.options import Options, from_token, options_of
from maskc.runtime import handles
from maskc.runtime.operands import check_scale
from maskc.runtime.permute import from_order, from_order_all, ordered_for, to_order, to_order_all

_dense_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _dense_mask(bound, device) -> torch.Tensor:
    """bool (Bm, Hm, S, K): the mask per mask batch element (Bm = 1 when broadcast) and head (Hm = 1 when
    the mask ignores h). Built by brute force, cached on the bound mask: the reference path is for small S."""
    per = _dense_cache.setdefault(bound, {})
    key = (device, getattr(bound, "version", 0))        # a DeviceMask's values change with its version
    if key not in per:
        for old in [k for k in per if k[1] != key[1]]:
            del per[old]
        heads = bound.num_heads or 1
        dense = [[torch.from_numpy(bound.dense(b, h)) for h in range(heads)] for b in range(bound.batch)]
        per[key] = torch.stack([torch.stack(row) for row in dense]).to(device)
    return per[key]


def _check_cpu_inputs(q, k, v, bound) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, S, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k and v must be (B, Hkv, Skv, D) matching q {tuple(q.shape)}; got {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[1] == 0 or Hq % k.shape[1]:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({k.shape[1]})")
    if (S, k.shape[2]) != (bound.seq_len, bound.kv_len):
        raise ValueError(f"inputs have seq_len {S}, kv_len {k.shape[2]}; the mask was bound to "
                         f"{bound.seq_len}, {bound.kv_len}")
    if bound.batch not in (1, B):
        raise ValueError(f"the mask was bound to batch={bound.batch}; inputs have batch {B}")
    if bound.num_heads is not None and bound.num_heads != Hq:
        raise ValueError(f"the mask was bound to num_heads={bound.num_heads}; q has {Hq} heads")


def _modified_scores(bound, s: torch.Tensor, grad: bool = False):
    """(mod(s), mod'(s) or None): the mask's score modifier on scaled scores (B, H, S, K), through its Flex
    score_mod (positions of a sub-block are its parent's); the derivative, when ``grad``, by autograd
    (the modifier is elementwise). (s, None) for a mask without one."""
    if bound.mask.resolved.score is None:
        return s, None
    parent, (q0, k0) = getattr(bound, "parent", bound), getattr(bound, "origin", (0, 0))
    score_mod = parent.flex_score_mod(s.device)
    B, H, S, K = s.shape
    at = lambda start, n, dim: torch.arange(start, start + n, device=s.device).view(  # noqa: E731
        [n if d == dim else 1 for d in range(4)])
    b = at(0, B, 0) if parent.batch > 1 else 0
    with torch.enable_grad():
        x = s.detach().requires_grad_(grad)
        y = score_mod(x, b, at(0, H, 1), at(q0, S, 2), at(k0, K, 3))
        slope = torch.autograd.grad(y.sum(), x)[0] if grad else None
    return y.detach(), slope


def _reference_probabilities(q, k, bound, scale, lse=None):
    """(P, LSE, k expanded over the GQA group, group size, mod'(scores) or None) in the compute dtype: P =
    softmax of the visible modified scaled scores (:func:`_modified_scores`), 0 where hidden and on rows that
    see nothing (their LSE = -inf). With ``lse`` given, P is recomputed from it, as the backward kernels do,
    and the modifier's derivative comes with it."""
    group = q.shape[1] // k.shape[1]
    kx = k.repeat_interleave(group, dim=1)
    visible = _dense_mask(bound, q.device)
    s, slope = _modified_scores(bound, torch.matmul(q, kx.transpose(-1, -2)) * scale, grad=lse is not None)
    s = s.masked_fill(~visible, -math.inf)
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    # exp(-inf - (-inf)) is NaN on rows without a visible key: those are zero
    p = torch.where(visible, torch.exp(s - lse.unsqueeze(-1)), torch.zeros((), dtype=s.dtype))
    return p, lse, kx, group, slope


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _reference_forward(q, k, v, bound, scale, options: Options | None = None):
    _check_cpu_inputs(q, k, v, bound)
    ordered = ordered_for(bound, options or Options.from_environment(), q, k)
    if ordered is not None:             # the token order the kernels would run in (maskc.ordered), as they do
        qp, kp, vp = (to_order(x, ordered) for x in (q, k, v))
        out, lse = _reference_forward(qp, kp, vp, ordered.inner, scale, options)
        return from_order(out, ordered), from_order(lse, ordered)
    cd = _compute_dtype(q)
    p, lse, _, group, _ = _reference_probabilities(q.to(cd), k.to(cd), bound, scale)
    out = torch.matmul(p, v.to(cd).repeat_interleave(group, dim=1))
    return out.to(q.dtype), lse


def _sum_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, Hq, ...) -> (B, Hkv, ...): the sum over each GQA group of query heads."""
    return x.unflatten(1, (x.shape[1] // group, group)).sum(2)


def _reference_backward(dout, q, k, v, out, lse, dlse, bound, scale, options: Options | None = None):
    ordered = ordered_for(bound, options or Options.from_environment(), q, k)
    if ordered is not None:
        dp, qp, kp, vp, op, lp, dlp = (to_order(x, ordered) for x in (dout, q, k, v, out, lse, dlse))
        grads = _reference_backward(dp, qp, kp, vp, op, lp, dlp, ordered.inner, scale, options)
        return tuple(from_order(g, ordered) for g in grads)
    cd = _compute_dtype(q)
    q_, k_, v_, out_, dout_ = (x.to(cd) for x in (q, k, v, out, dout))
    p, _, kx, group, slope = _reference_probabilities(q_, k_, bound, scale, lse=lse.to(cd))
    delta = (dout_ * out_).sum(-1)
    if dlse is not None:
        delta = delta - dlse.to(cd)
    dv = _sum_groups(torch.matmul(p.transpose(-1, -2), dout_), group)
    dp = torch.matmul(dout_, v_.repeat_interleave(group, dim=1).transpose(-1, -2))
    ds = p * (dp - delta.unsqueeze(-1))
    if slope is not None:               # through the score modifier: dS_in = dS_out * mod'(s)
        ds = ds * slope
    dq = torch.matmul(ds, kx) * scale
    dk = _sum_groups(torch.matmul(ds.transpose(-1, -2), q_), group) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """x itself when the kernels can read it (last dim contiguous, 16-byte rows), else a contiguous copy:
    autograd hands over gradients of any layout (an expanded one for ``out.sum()``)."""
    aligned = x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in x.stride()[:-1])
    return x if aligned else x.contiguous()


def _forward(q, k, v, bound, scale, options: Options | None = None):
    """(O, LSE); ``options`` None: the environment's (the CPU's reference path takes only its token order)."""
    if q.is_cuda:
        from maskc.runtime.kernels import attention
        return attention(q, k, v, bound, scale=scale, return_lse=True, options=options)
    return _reference_forward(q, k, v, bound, scale, options)


def _backward_of(dout, q, k, v, out, lse, dlse, bound, scale, deterministic, options: Options | None = None):
    if dout is None:                   # only LSE was used
        dout = torch.zeros_like(out)
    if q.is_cuda:
        from maskc.runtime.kernels import attention_backward as kernels
        return kernels(_kernel_layout(dout), q, k, v, out, lse, bound, scale=scale,
                       dlse=dlse.contiguous() if dlse is not None else None, deterministic=deterministic,
                       options=options)
    return _reference_backward(dout, q, k, v, out, lse, dlse, bound, scale, options)


# ---- eager autograd: an autograd.Function (the custom ops' Python dispatch costs ~1 ms a training step) ----

class _Attention(torch.autograd.Function):
    """A mask run in a token order (maskc.ordered) keeps q, k, v and LSE as the forward moved them into the order,
    instead of the caller's: the backward then moves only dO and O in (not q, k and v again), and the memory held
    is the same where the caller's q, k, v are not kept otherwise (the usual case: a projection's backward needs
    its input, not q). The CPU's reference path takes the same steps."""

    @staticmethod
    def forward(ctx, q, k, v, bound, scale, deterministic, options):
        ctx.ordered = ordered_for(bound, options, q, k)
        if ctx.ordered is not None:
            qp, kp, vp = to_order_all((q, k, v), ctx.ordered, options)
            op, lp = _forward(qp, kp, vp, ctx.ordered.inner, scale, options)
            out, lse = from_order_all((op, lp), ctx.ordered, options)
            ctx.save_for_backward(qp, kp, vp, out, lp)
        else:
            out, lse = _forward(q, k, v, bound, scale, options)
            ctx.save_for_backward(q, k, v, out, lse)
        ctx.bound, ctx.scale, ctx.deterministic = bound, scale, deterministic   # ctx keeps the mask alive
        ctx.options = options
        ctx.set_materialize_grads(False)   # an unused LSE stays None: no zero tensor to build and read
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if ctx.ordered is not None:        # q, k, v and LSE are in the order already
            if dout is None:
                dout = torch.zeros_like(out)
            dp, op, dlp = to_order_all((_kernel_layout(dout), out, dlse), ctx.ordered, ctx.options)
            grads = _backward_of(dp, q, k, v, op, lse, dlp, ctx.ordered.inner, ctx.scale, ctx.deterministic,
                                 ctx.options)
            dq, dk, dv = from_order_all(grads, ctx.ordered, ctx.options)
        else:
            dq, dk, dv = _backward_of(dout, q, k, v, out, lse, dlse, ctx.bound, ctx.scale, ctx.deterministic,
                                      ctx.options)
        return dq, dk, dv, None, None, None, None


# ---- torch.compile: custom ops with fake implementations, tied together by register_autograd ----------

def _bound(mask: torch.Tensor):
    """The bound mask whose handle the 0-d tensor ``mask`` holds."""
    return handles.lookup(int(mask))


@torch.library.custom_op("maskc::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                      deterministic: bool, options: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) for the bound mask whose handle the 0-d int64 tensor ``mask`` holds; ``deterministic`` is for
    the backward; ``options``: an Options token ("": the environment's)."""
    bound = _bound(mask)
    handles.keep_alive(bound)   # the autograd graph holds only the handle; its backward needs the mask
    return _forward(q, k, v, bound, scale, from_token(options))


@attention_forward.register_fake
def _(q, k, v, mask, scale, deterministic, options):
    B, H, S, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, S), dtype=_compute_dtype(q) if not q.is_cuda else torch.float32)


@torch.library.custom_op("maskc::attention_backward", mutates_args=())
def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, dlse: Optional[torch.Tensor], mask: torch.Tensor, scale: float,
                       deterministic: bool, options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of attention_forward for the output gradient ``dout`` (and ``dlse``, may be None)."""
    return _backward_of(dout, q, k, v, out, lse, dlse, _bound(mask), scale, deterministic, from_token(options))


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, dlse, mask, scale, deterministic, options):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, scale, deterministic, options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mask, ctx.scale, ctx.deterministic, ctx.options = mask, scale, deterministic, options
    ctx.set_materialize_grads(False)   # an unused LSE stays None: no zero tensor to build and read
    # The graph holds only the handle; the forward op's keep_alive holds the mask until its backward.


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:                   # only LSE was used; the op's schema wants a tensor
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_backward(dout, q, k, v, out, lse, dlse, ctx.mask, ctx.scale, ctx.deterministic,
                                    ctx.options)
    return dq, dk, dv, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bound, scale: float | None = None,
              return_lse: bool = False, deterministic: bool = False, options: Options | None = None):
    """Differentiable masked attention on torch tensors (CUDA: maskc's kernels; CPU: the reference path).

    Shapes (B, Hq, S, D) and (B, Hkv, Skv, D); returns O, and LSE with ``return_lse`` (its gradient, if
    any, flows back too). ``deterministic``: a backward without atomics, bitwise repeatable. ``options``:
    how the kernels are built and run (default: the environment's, read by this call; its backward uses the
    same)."""
    scale = check_scale(scale, q.shape[-1])      # the CPU path took nan and negative scales the kernels refuse
    if torch.compiler.is_compiling():
        if options is not None:
            options_of(options, "attention()")         # a TypeError naming what it takes, not one from below
        token = "" if options is None else options.token
        handle = getattr(bound, "token", None)                  # a DeviceMask's: what its updates mutate
        if handle is None:
            handle = torch.from_numpy(bound.handle_array)      # data, not a guarded constant
        out, lse = attention_forward(q, k, v, handle, float(scale), bool(deterministic), token)
        return (out, lse) if return_lse else out
    # The environment is read once per call, here: the forward and its backward run with the same options, and
    # the backward does not read the 15 variables again.
    options = options_of(options, "attention()")
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # Inference: no graph to record, and on CUDA no LSE to compute unless it is asked for.
        if q.is_cuda:
            from maskc.runtime.kernels import attention as kernel
            return kernel(q, k, v, bound, scale=float(scale), return_lse=return_lse, options=options)
        out, lse = _reference_forward(q, k, v, bound, float(scale), options)
    else:
        out, lse = _Attention.apply(q, k, v, bound, float(scale), bool(deterministic), options)
    return (out, lse) if return_lse else out
