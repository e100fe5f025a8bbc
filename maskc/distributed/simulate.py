"""Predicted per-rank work, bytes moved and step time of context-parallel attention, from the plan alone.

The model, rank by rank and step by step, as :mod:`.ops` runs (one step ahead of the transfers):

- compute of step s on rank r: its visible pairs with the source's keys times ``4 * D * Hq * B`` flops at
  ``fwd_tflops`` (``2.5x`` that work at ``bwd_tflops`` backward: the convention of maskc's measured
  figures), plus ``call_us`` (``bwd_call_us``) host time per call and the LSE merge's memory traffic at
  ``hbm_gbs``. A query block's pairs are split over the sources in proportion to its tiles' cost there
  (FULL 1, PARTIAL 1.25, the descriptor's ``work_order`` weights).
- a transfer of step s starts when both ends have posted it (rank x posts step s + 1 when it starts
  computing step s) and its receiver's in-link and sender's out-link are free; it takes ``latency_us``
  plus bytes over ``nvlink_gbs`` inside a node of ``gpus_per_node`` GPUs, ``ib_gbs`` across nodes.
- compute of step s starts when step s - 1 is done and step s's K/V has arrived. The backward fetches
  the same K/V again and, after each step, sends dK/dV (the K/V's bytes) back to the source once both
  have computed that step (returns are not counted against the links); a rank is done when its last step
  is computed and every return to it has arrived.

What it leaves out: SM time taken by NCCL's kernels, kernel efficiency falling on small calls, contention
beyond one in-link and one out-link per GPU, and the rest of the model. ``Hardware``'s defaults say which
figures were measured (on one H200) and which are data-sheet assumptions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from maskc.runs import PARTIAL_COST
from maskc.distributed.traffic import Plan


@dataclass(frozen=True)
class Hardware:
    """Per-GPU throughput and links. Measured (README, bench/NOTES.md, one H200): ``fwd_tflops`` (maskc's
    causal forward at 32K, run 23), ``bwd_tflops`` (its backward, run 26), ``call_us`` and ``bwd_call_us``
    (host cost per forward call and per backward's launches, run 20). Assumed from data sheets:
    ``nvlink_gbs`` (NVLink 4, per direction), ``ib_gbs`` (400 Gb/s NDR per GPU), ``hbm_gbs`` (H200),
    ``latency_us``."""

    fwd_tflops: float = 507.0
    bwd_tflops: float = 410.0
    call_us: float = 46.0
    bwd_call_us: float = 118.0
    nvlink_gbs: float = 450.0
    ib_gbs: float = 50.0
    gpus_per_node: int = 8
    latency_us: float = 10.0
    hbm_gbs: float = 4800.0


@dataclass(frozen=True)
class Shape:
    """The attention's sizes besides the sequence: batch, query heads, K/V heads, head dim, bytes per element."""

    batch: int = 1
    heads: int = 16
    kv_heads: int = 16
    head_dim: int = 128
    itemsize: int = 2

    def kv_bytes(self, tokens) -> float:
        """Bytes of K and V for ``tokens`` positions."""
        return 2.0 * tokens * self.batch * self.kv_heads * self.head_dim * self.itemsize


@dataclass(frozen=True)
class Prediction:
    """Per rank (arrays of world_size) and overall; times in ms, bytes per pass."""

    world_size: int
    pairs: np.ndarray            # visible pairs per rank
    recv_bytes: np.ndarray       # K/V bytes each rank receives in the forward
    calls: np.ndarray            # single-device calls per rank per pass
    fwd_done_ms: np.ndarray
    bwd_done_ms: np.ndarray
    ideal_ms: float              # every pair at full throughput, perfectly spread, no communication

    imbalance = property(lambda self: float(self.pairs.max() / self.pairs.mean()) if self.pairs.mean() else 1.0)
    fwd_ms = property(lambda self: float(self.fwd_done_ms.max()))
    bwd_ms = property(lambda self: float(self.bwd_done_ms.max()))
    step_ms = property(lambda self: self.fwd_ms + self.bwd_ms)
    efficiency = property(lambda self: self.ideal_ms / self.step_ms if self.step_ms else 1.0)
    # forward K/V, and the backward's K/V again plus dK/dV back
    bytes_fwd = property(lambda self: float(self.recv_bytes.sum()))
    bytes_bwd = property(lambda self: 2.0 * float(self.recv_bytes.sum()))


def pairs_by_source(plan: Plan) -> np.ndarray:
    """float64[R, R]: visible pairs of rank r's queries with rank o's keys (row r, column o); each query
    block's exact pairs split over the sources by its tiles' cost there (see the module docstring)."""
    sh = plan.sharding
    R, nb = sh.world_size, sh.n_blocks
    tm = plan.bound.tile_map(sh.block, sh.block)
    # owned[o, j]: blocks of rank o among the first j key blocks
    owned = np.zeros((R, nb + 1), np.int64)
    owned[:, 1:] = np.cumsum(sh.owner[None, :] == np.arange(R)[:, None], axis=1)
    runs = tm.runs.astype(np.int64)
    q_block = np.repeat(np.arange(tm.batch * tm.n_q_blocks), np.diff(tm.run_offsets)) % tm.n_q_blocks
    weight = np.where(runs[:, 2] == 1, PARTIAL_COST, 1.0)
    cost = np.zeros((nb, R))
    np.add.at(cost, q_block, ((owned[:, runs[:, 1]] - owned[:, runs[:, 0]]) * weight).T)
    total = cost.sum(axis=1, keepdims=True)
    share = np.divide(cost, total, out=np.zeros_like(cost), where=total > 0)
    per_block = share * sh.work[:, None]
    out = np.zeros((R, R))
    np.add.at(out, sh.owner, per_block)
    return out


def predict(plan: Plan, shape: Shape = Shape(), hw: Hardware = Hardware()) -> Prediction:
    """The model of the module docstring for ``plan``."""
    R, r_ = plan.world_size, np.arange(plan.world_size)
    sh = plan.sharding
    pairs = pairs_by_source(plan)
    flops = 4.0 * shape.head_dim * shape.heads * shape.batch
    # per rank and step: compute ms (forward, backward), bytes in, and who sends
    src = (r_[:, None] - r_[None, :]) % R                                  # src[r, s]
    step_pairs = pairs[r_[:, None], src]
    ncalls = np.array([[len(plan.calls[r][s]) for s in range(R)] for r in range(R)])
    merge_rows = np.array([[sum(c.q_rows[1] - c.q_rows[0] for c in plan.calls[r][s]) for s in range(R)]
                           for r in range(R)])
    merge_ms = merge_rows * shape.batch * shape.heads * (shape.head_dim + 1) * 4 * 4 / (hw.hbm_gbs * 1e6)
    fwd = step_pairs * flops / (hw.fwd_tflops * 1e9) + ncalls * hw.call_us / 1e3 + merge_ms
    bwd = 2.5 * step_pairs * flops / (hw.bwd_tflops * 1e9) + ncalls * hw.bwd_call_us / 1e3
    nbytes = np.array([[shape.kv_bytes(len(plan.recv[r][s]) * sh.block) if s else 0.0 for s in range(R)]
                       for r in range(R)])

    def link_ms(a, b, size):
        bw = hw.nvlink_gbs if a // hw.gpus_per_node == b // hw.gpus_per_node else hw.ib_gbs
        return hw.latency_us / 1e3 + size / (bw * 1e6) if size else 0.0

    def run(compute, returns: bool):
        done = np.zeros(R)                  # end of the last computed step
        start = np.zeros((R, R))            # start[r, s] of compute
        rx, tx = np.zeros(R), np.zeros(R)   # when each GPU's in-link and out-link are free
        back = np.zeros(R)                  # latest arrival of a dK/dV return, per receiver
        for s in range(R):
            arrive = np.zeros(R)
            if s:
                for r in range(R):
                    o = src[r, s]
                    t = s - plan.depth
                    posted = max(start[r, t], start[o, t]) if t >= 0 else 0.0
                    if nbytes[r, s]:
                        t0 = max(posted, rx[r], tx[o])
                        arrive[r] = rx[r] = tx[o] = t0 + link_ms(o, r, nbytes[r, s])
                    else:
                        arrive[r] = start[r, s - 1]
            start[:, s] = np.maximum(done, arrive)
            done = start[:, s] + compute[:, s]
            if returns and s:               # dK/dV of step s go back to the source once both have computed it
                for r in range(R):
                    if nbytes[r, s]:
                        o = src[r, s]
                        back[o] = max(back[o], max(done[r], done[o]) + link_ms(r, o, nbytes[r, s]))
        return np.maximum(done, back)

    total_pairs = pairs.sum()
    ideal = total_pairs * flops * (1 / hw.fwd_tflops + 2.5 / hw.bwd_tflops) / 1e9 / R
    return Prediction(R, pairs.sum(axis=1), nbytes.sum(axis=1), ncalls.sum(axis=1), run(fwd, False),
                      run(bwd, True), float(ideal))


def seen_kv_tokens(plan: Plan) -> np.ndarray:
    """int64[R]: positions of other ranks' K/V that some query of rank r sees, by the rows' visible
    intervals (exact masks that do not read h): the least any scheme must move to rank r."""
    from maskc.analysis.classify import visible_intervals

    bound, sh = plan.bound, plan.sharding
    if not bound.mask.exact or bound.mask.ranges.uses_head:
        raise NotImplementedError("seen K/V is counted from exact row intervals")
    K = bound.kv_len
    out = np.zeros(sh.world_size, np.int64)
    for r in range(sh.world_size):
        rows = sh.rows(r)
        edges = np.zeros(K + 1, np.int64)
        for b, element in enumerate(bound.params.batch):
            ranges = bound.mask.specialized(element.ints)
            _, lo, hi = visible_intervals(ranges, element, bound.seq_len, K, b, rows)
            np.add.at(edges, lo, 1)
            np.add.at(edges, hi, -1)
        seen = np.cumsum(edges)[:-1] > 0
        seen[rows] = False
        out[r] = int(seen.sum())
    return out
