"""Context parallelism: maskc attention over a sequence sharded across a torch.distributed process group.

    import maskc, maskc.distributed as cp
    bound = maskc.load("examples/document.mask").bind(seq_len=S, docs=lengths)
    plan = cp.plan(bound, world_size)             # pure: the same on every rank, from the tiles alone
    q_r = plan.shard(q, rank)                      # this rank's rows (plan.permutation: all of them)
    out_r = cp.attention(q_r, k_r, v_r, plan)      # differentiable; NCCL on GPUs, gloo on CPUs

- :mod:`.shard`: which query blocks each rank holds, balancing visible pairs (:mod:`.work`) per rank.
- :mod:`.traffic`: per rank and step, the K/V blocks received (only those its queries see) and the
  single-device calls on sub-blocks of the mask (``BoundMask.restrict``).
- :mod:`.ops`: the exchange, the LSE merge and the backward under autograd and torch.compile.
- :mod:`.simulate`: per-rank work, bytes and step time for 2-64 GPUs, from the plan alone.

Only :mod:`.ops` imports torch.
"""
from __future__ import annotations

from maskc.distributed.shard import Sharding, ShardingError, assign, shard
from maskc.distributed.traffic import Call, Plan, make_plan
from maskc.distributed.work import block_pairs


def plan(bound, world_size: int, block: int = 128, tolerance: float = 1.02, min_block: int | None = None,
         ranks_per_node: int | None = None, prefetch_tokens: int | None = None) -> Plan:
    """The context-parallel plan of ``bound`` over ``world_size`` ranks: :func:`shard` (blocks of ``block``
    query rows, halved down to ``min_block`` if that balances better; nodes first, then their ranks, with
    ``ranks_per_node``) then :func:`make_plan` (K/V in flight per rank bounded by ``prefetch_tokens``
    positions, default four shards)."""
    sharding = shard(bound, world_size, block, tolerance, min_block, ranks_per_node)
    return make_plan(bound, sharding, prefetch_tokens=prefetch_tokens)


def attention(q, k, v, plan: Plan, group=None, scale=None, return_lse: bool = False, deterministic: bool = False):
    """This rank's rows of masked attention over the whole sequence: :func:`maskc.distributed.ops.attention`."""
    from maskc.distributed.ops import attention as _attention
    return _attention(q, k, v, plan, group=group, scale=scale, return_lse=return_lse, deterministic=deterministic)


__all__ = ["plan", "attention", "shard", "assign", "make_plan", "block_pairs", "Plan", "Call", "Sharding",
           "ShardingError"]
