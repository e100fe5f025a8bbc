"""Context-parallel maskc attention on torch.distributed (NCCL on GPUs, gloo on CPUs), with autograd.

    plan = maskc.distributed.plan(bound, world_size)         # the same on every rank (pure, from the mask)
    q_r, k_r, v_r = (plan.shard(x, rank) for x in (q, k, v))  # or build the shards directly in that order
    out_r = maskc.distributed.attention(q_r, k_r, v_r, plan)  # this rank's rows of the output

Each rank holds the rows ``plan.rows(rank)`` of q, k and v (B, H, local_len, D). The forward walks the
plan's steps (:mod:`.traffic`): at step s it computes with the K/V blocks received from rank - s (step 0:
its own), while the transfer of step s + 1 is already posted; every call is ``maskc``'s single-device op
on a sub-block of the mask (``BoundMask.restrict``: the CUDA kernels on GPU tensors, the reference path
on CPU ones), and the partial outputs are merged by their LSE in fp32 (fp64 for fp64 inputs). The
backward takes the merged O and LSE, fetches the same K/V blocks again (memory stays O(shard): no rank
keeps another's K/V between the passes), computes every call's dQ, dK, dV with the single-device backward
(which recomputes P from the global LSE, so the pieces add up exactly), and sends dK and dV back to the
blocks' owners only, in the inputs' dtype, each owner adding them in fp32.

Overlap: transfers are ``batch_isend_irecv`` point-to-point ops posted ``plan.depth`` steps ahead (as far
as the plan's memory budget allows; 1 for causal). With NCCL they run on NCCL's streams and
``Work.wait()`` only makes the compute stream wait for them, so later steps' transfers overlap this step's
kernels; with gloo they run on gloo's threads. Every rank posts the same global sequence of exchanges
(with depth 1: fetch 1, fetch 2, return 1, fetch 3, return 2, ...; ``depth`` is one number for all), so
the messages between any two ranks pair up in order on both sides; a pair with nothing to exchange at a
step posts nothing.

torch.compile: the whole exchange runs inside two custom ops (``maskc::cp_attention_forward`` and
``maskc::cp_attention_backward``, with fake implementations and ``register_autograd``), so a compiled
model traces it as one opaque node and its communication is never reordered by the compiler; the plan and
process group travel as an integer handle (:mod:`maskc.runtime.handles`). Every rank must compile the same graph.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from maskc.distributed.traffic import Plan
from maskc.runtime import handles
from maskc.runtime.torch_ops import _backward_of as _local_backward
from maskc.runtime.torch_ops import _forward as _local_forward


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@dataclass(frozen=True, eq=False)
class _Runtime:
    """A plan bound to a process group and this process's rank in it."""

    plan: Plan
    group: Optional[dist.ProcessGroup]      # None: the default group
    rank: int
    handle: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "handle", handles.register(self))

    def rows_index(self, blocks, device) -> torch.Tensor:
        """int64 rows of this rank's shard holding ``blocks`` (its own), cached per device."""
        cache = self.__dict__.setdefault("_rows", {})
        key = (blocks.tobytes(), str(device))
        if key not in cache:
            sh = self.plan.sharding
            rows = (sh.local_block[blocks][:, None] * sh.block + np.arange(sh.block)).reshape(-1)
            cache[key] = torch.as_tensor(rows, device=device)
        return cache[key]


def _runtime(plan: Plan, group) -> _Runtime:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("maskc.distributed.attention needs torch.distributed initialized (init_process_group)")
    size = dist.get_world_size(group)
    if size != plan.world_size:
        raise ValueError(f"the plan is for {plan.world_size} ranks; the process group has {size}")
    cache = plan.__dict__.setdefault("_runtimes", {})
    if group not in cache:
        cache[group] = _Runtime(plan, group, dist.get_rank(group))
    return cache[group]


@torch.compiler.assume_constant_result
def _runtime_handle(plan: Plan, group) -> int:
    """The runtime's handle, computed when torch.compile traces (a constant of the graph)."""
    return _runtime(plan, group).handle


class _Pending:
    """Posted transfers and the buffer they fill; ``wait`` returns the buffer (None when nothing comes)."""

    def __init__(self, works, received, sent):
        self.works, self.received, self.sent = works, received, sent   # ``sent`` is kept alive until done

    def wait(self):
        for w in self.works:
            w.wait()
        self.sent = None
        return self.received


def _post(rt: _Runtime, send, to: int, recv, frm: int, tag: int) -> _Pending:
    ops = []
    if send is not None:
        ops.append(dist.P2POp(dist.isend, send, group=rt.group, group_peer=to, tag=tag))
    if recv is not None:
        ops.append(dist.P2POp(dist.irecv, recv, group=rt.group, group_peer=frm, tag=tag))
    return _Pending(dist.batch_isend_irecv(ops) if ops else [], recv, send)


def _fetch(rt: _Runtime, step: int, k: torch.Tensor, v: torch.Tensor) -> _Pending:
    """Post step ``step``'s K/V exchange: to rank + step the blocks it needs of ours, from rank - step ours."""
    plan, r, R = rt.plan, rt.rank, rt.plan.world_size
    give, take = plan.send(r, step), plan.recv[r][step]
    send = recv = None
    if len(give):
        idx = rt.rows_index(give, k.device)
        send = torch.stack([k.index_select(2, idx), v.index_select(2, idx)])
    if len(take):
        B, H, _, D = k.shape
        recv = k.new_empty((2, B, H, len(take) * plan.block, D))
    return _post(rt, send, (r + step) % R, recv, (r - step) % R, tag=2 * step)


class _Fetches:
    """The K/V exchanges of steps 1 .. R-1, posted ``plan.depth`` steps ahead of the compute: the first
    ``depth`` at once, then one more each time a step's K/V is taken."""

    def __init__(self, rt: _Runtime, k, v):
        self.rt, self.k, self.v = rt, k, v
        self.posted: collections.deque = collections.deque()
        self.next_step = 1
        for _ in range(min(rt.plan.depth, rt.plan.world_size - 1)):
            self._post()

    def _post(self):
        self.posted.append(_fetch(self.rt, self.next_step, self.k, self.v))
        self.next_step += 1

    def next(self):
        """The next step's K/V buffer (2, B, Hkv, rows, D), or None when it receives nothing."""
        kv = self.posted.popleft().wait()
        if self.next_step < self.rt.plan.world_size:
            self._post()
        return kv


def _give_back(rt: _Runtime, step: int, grads: Optional[torch.Tensor], like: torch.Tensor) -> _Pending:
    """Post step ``step``'s dK/dV return: to rank - step the gradients of its blocks we used, from
    rank + step those of ours it used."""
    plan, r, R = rt.plan, rt.rank, rt.plan.world_size
    mine = plan.send(r, step)
    recv = None
    if len(mine):
        B, H, _, D = like.shape
        recv = like.new_empty((2, B, H, len(mine) * plan.block, D))
    send = grads.to(like.dtype) if grads is not None else None
    return _post(rt, send, (r - step) % R, recv, (r + step) % R, tag=2 * step + 1)


def _merge_into(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, l: torch.Tensor) -> None:
    """out, lse (views of the accumulators) <- the softmax-weighted union of (out, lse) and (o, l); rows
    that have seen nothing so far (lse = -inf) take (o, l) exactly."""
    l = l.to(lse.dtype)
    new = torch.logaddexp(lse, l)
    base = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    out.mul_(torch.exp(lse - base).unsqueeze(-1)).add_(o.to(out.dtype) * torch.exp(l - base).unsqueeze(-1))
    lse.copy_(new)


def _forward(rt: _Runtime, q, k, v, scale: float):
    plan, r, R = rt.plan, rt.rank, rt.plan.world_size
    acc = _acc_dtype(q)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:3], -math.inf, dtype=acc, device=q.device)

    def attend(step, kb, vb):
        for call in plan.calls[r][step]:
            qs, ks = slice(*call.q_rows), slice(*call.kv_rows)
            o, l = _local_forward(q[:, :, qs], kb[:, :, ks], vb[:, :, ks], plan.restricted(call), scale)
            _merge_into(out[:, :, qs], lse[:, :, qs], o, l)

    fetches = _Fetches(rt, k, v)
    attend(0, k, v)
    for step in range(1, R):
        kv = fetches.next()
        if kv is not None:
            attend(step, kv[0], kv[1])
    return out.to(q.dtype), lse


def _backward(rt: _Runtime, dout, q, k, v, out, lse, dlse, scale: float, deterministic: bool):
    plan, r, R = rt.plan, rt.rank, rt.plan.world_size
    acc = _acc_dtype(q)
    if dout is None:                    # only LSE was used
        dout = torch.zeros_like(out)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)

    def grad(step, kb, vb, dk_to, dv_to):
        for call in plan.calls[r][step]:
            qs, ks = slice(*call.q_rows), slice(*call.kv_rows)
            g = _local_backward(dout[:, :, qs], q[:, :, qs], kb[:, :, ks], vb[:, :, ks], out[:, :, qs],
                                lse[:, :, qs].contiguous(), None if dlse is None else dlse[:, :, qs].contiguous(),
                                plan.restricted(call), scale, deterministic)
            dq[:, :, qs] += g[0]
            dk_to[:, :, ks] += g[1]
            dv_to[:, :, ks] += g[2]

    fetches = _Fetches(rt, k, v)
    grad(0, k, v, dk, dv)
    returns = []
    for step in range(1, R):
        kv = fetches.next()
        grads = None
        if kv is not None:
            grads = torch.zeros(kv.shape, dtype=acc, device=kv.device)
            grad(step, kv[0], kv[1], grads[0], grads[1])
        returns.append((step, _give_back(rt, step, grads, k)))
    for step, ret in returns:
        back = ret.wait()
        if back is not None:
            idx = rt.rows_index(plan.send(r, step), k.device)
            dk.index_add_(2, idx, back[0].to(acc))
            dv.index_add_(2, idx, back[1].to(acc))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---- eager autograd ---------------------------------------------------------------------------------------

class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rt, scale, deterministic):
        out, lse = _forward(rt, q, k, v, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.rt, ctx.scale, ctx.deterministic = rt, scale, deterministic
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(ctx.rt, dout, q, k, v, out, lse, dlse, ctx.scale, ctx.deterministic)
        return dq, dk, dv, None, None, None


# ---- torch.compile: custom ops with fake implementations -------------------------------------------------

@torch.library.custom_op("maskc::cp_attention_forward", mutates_args=())
def cp_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, runtime: int, scale: float,
                         deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) of this rank's shard for the plan and group with handle ``runtime``."""
    rt = handles.lookup(runtime)
    handles.keep_alive(rt)
    return _forward(rt, q, k, v, scale)


@cp_attention_forward.register_fake
def _(q, k, v, runtime, scale, deterministic):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=_acc_dtype(q))


@torch.library.custom_op("maskc::cp_attention_backward", mutates_args=())
def cp_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, dlse: Optional[torch.Tensor], runtime: int, scale: float,
                          deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(handles.lookup(runtime), dout, q, k, v, out, lse, dlse, scale, deterministic)


@cp_attention_backward.register_fake
def _(dout, q, k, v, out, lse, dlse, runtime, scale, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, runtime, scale, deterministic = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.runtime, ctx.scale, ctx.deterministic = runtime, scale, deterministic
    ctx.set_materialize_grads(False)


def _backward_op(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = cp_attention_backward(dout, q, k, v, out, lse, dlse, ctx.runtime, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None


cp_attention_forward.register_autograd(_backward_op, setup_context=_setup_context)


def _check(q, k, v, plan: Plan) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, local_len, D) with k and v alike; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[2] != plan.local_len or k.shape[2] != plan.local_len:
        raise ValueError(f"each rank holds {plan.local_len} rows (seq_len {plan.seq_len} over {plan.world_size} "
                         f"ranks); got q with {q.shape[2]}, k with {k.shape[2]}")
    if plan.bound.batch not in (1, q.shape[0]):
        raise ValueError(f"the mask was bound to batch={plan.bound.batch}; inputs have batch {q.shape[0]}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, group=None, scale: float | None = None,
              return_lse: bool = False, deterministic: bool = False):
    """This rank's rows of masked attention over the whole sequence (see the module docstring).

    ``q`` (B, Hq, local_len, D) and ``k``, ``v`` (B, Hkv, local_len, D): the rows ``plan.rows(rank)`` of
    each; ``group``: the process group over which the sequence is sharded (default: the default group),
    of ``plan.world_size`` ranks. Returns O (and LSE, fp32 or fp64 for fp64 inputs, with ``return_lse``) for
    the same rows; differentiable. Every rank of the group must call it with the same plan."""
    _check(q, k, v, plan)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if torch.compiler.is_compiling():
        out, lse = cp_attention_forward(q, k, v, _runtime_handle(plan, group), scale, bool(deterministic))
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _Attention.apply(q, k, v, _runtime(plan, group), scale, bool(deterministic))
    else:
        out, lse = _forward(_runtime(plan, group), q, k, v, scale)
    return (out, lse) if return_lse else out
