"""Hand-made bound masks for testing the kernel and runtime before (and beside) the real mask passes.

Each mock has the attributes and methods the runtime asks of a bound mask (see maskc/runtime.py) plus
``visible(b, q, k)``, a numpy oracle on index arrays, and ``name``. Descriptors are built row block by row
block from the oracle, so a 32K mask never materializes S x S.
"""
from __future__ import annotations

import numpy as np

from maskc.kernel_ir import Descriptor, KernelSpec

PRED_CAUSAL = """\
struct MaskRow { int q; };
__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) { return MaskRow{q}; }
__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) { return k <= row.q; }
"""

PRED_FULL = """\
struct MaskRow { int q; };
__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) { return MaskRow{q}; }
__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) { return true; }
"""

# mask[0] = window w: q - w < k <= q
PRED_SLIDING = """\
struct MaskRow { int lo, hi; };
__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) { return MaskRow{q - mask[0], q}; }
__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) { return k > row.lo && k <= row.hi; }
"""

# mask[i] = document id of token i (per batch element); causal within a document
PRED_DOCUMENT = """\
struct MaskRow { int q, doc; };
__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) { return MaskRow{q, mask[q]}; }
__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) { return k <= row.q && mask[k] == row.doc; }
"""

# mask[0] = first row that sees anything; causal after it (rows before it: O = 0, LSE = -inf)
PRED_LATE = """\
struct MaskRow { bool on; int q; };
__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) { return MaskRow{q >= mask[0], q}; }
__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) { return row.on && k <= row.q; }
"""

# head-dependent: head h sees keys k <= q with (k + h) % 3 != 0
PRED_HEADS = """\
struct MaskRow { int q, h; };
__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) { return MaskRow{q, h}; }
__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) { return k <= row.q && (k + row.h) % 3 != 0; }
"""


class MockBound:
    def __init__(self, name, seq_len, kv_len, batch, predicate, visible, tables=None, num_heads=None):
        self.name = name
        self.seq_len, self.kv_len, self.batch = seq_len, kv_len, batch
        self.num_heads = num_heads
        self.predicate = predicate
        self._visible = visible              # (b, h, q[:, None], k[None, :]) -> bool array
        self.tables = tables or [np.zeros(1, np.int32) for _ in range(batch)]
        self.descriptor_calls = 0

    def visible(self, b, q, k, h=0):
        return np.broadcast_to(self._visible(b, h, q, k), np.broadcast_shapes(q.shape, k.shape))

    def dense(self, h=0):
        q, k = np.arange(self.seq_len)[:, None], np.arange(self.kv_len)[None, :]
        return np.stack([self.visible(b, q, k, h) for b in range(self.batch)])

    def visible_pairs(self) -> int:
        heads = range(self.num_heads) if self.num_heads else [0]
        total = 0
        k = np.arange(self.kv_len)[None, :]
        for h in heads:
            for b in range(self.batch):
                for q0 in range(0, self.seq_len, 1024):
                    q = np.arange(q0, min(self.seq_len, q0 + 1024))[:, None]
                    total += int(self.visible(b, q, k, h).sum())
        return total * (1 if self.num_heads else 1)

    def kernel_spec(self, *, head_dim, dtype, block_m, block_n, num_warps):
        return KernelSpec(mask_name=self.name, head_dim=head_dim, dtype=dtype, block_m=block_m,
                          block_n=block_n, num_warps=num_warps, predicate=self.predicate,
                          mask_summary=(f"mock mask {self.name} (tests/mock_masks.py)",))

    def descriptor(self, block_m, block_n) -> Descriptor:
        self.descriptor_calls += 1
        S, Skv, B = self.seq_len, self.kv_len, self.batch
        QT, KT = -(-S // block_m), -(-Skv // block_n)
        heads = range(self.num_heads) if self.num_heads else [0]
        k = np.arange(KT * block_n)[None, :]
        in_range = k < Skv
        offsets, runs, costs = [0], [], []
        for b in range(B):
            for i in range(QT):
                q = np.arange(i * block_m, min(S, (i + 1) * block_m))[:, None]
                anyb = np.zeros(KT, bool)
                allb = np.ones(KT, bool)
                for h in heads:   # a head-dependent mask: a tile is FULL only if FULL for every head
                    vis = np.broadcast_to(self._visible(b, h, q, np.minimum(k, Skv - 1)),
                                          (q.shape[0], k.shape[1])) & in_range
                    anyb |= vis.reshape(-1, KT, block_n).any(axis=(0, 2))
                    allb &= (vis | ~in_range).reshape(-1, KT, block_n).all(axis=(0, 2))
                kinds = np.where(allb, 2, np.where(anyb, 1, 0))
                j = 0
                while j < KT:
                    if kinds[j] == 0:
                        j += 1
                        continue
                    e = j
                    while e < KT and kinds[e] == kinds[j]:
                        e += 1
                    runs.append((j, e, int(kinds[j])))
                    j = e
                offsets.append(len(runs))
                costs.append(float((kinds == 2).sum() + 1.25 * (kinds == 1).sum()))
        work = np.argsort(-np.asarray(costs), kind="stable").astype(np.int32)
        tables = [np.asarray(t, np.int32).reshape(-1) for t in self.tables]
        mask_offsets = np.concatenate([[0], np.cumsum([t.size for t in tables])]).astype(np.int32)
        return Descriptor(
            block_m=block_m, block_n=block_n, batch=B, seq_len=S, kv_len=Skv,
            run_offsets=np.asarray(offsets, np.int32),
            runs=np.asarray(runs, np.int32).reshape(-1, 3),
            work_order=work, mask_data=np.concatenate(tables).astype(np.int32), mask_offsets=mask_offsets,
            col_offsets=np.zeros(B * KT + 1, np.int32), col_runs=np.zeros((0, 3), np.int32))


def causal(seq_len, kv_len=None, batch=1):
    return MockBound("causal", seq_len, kv_len or seq_len, batch, PRED_CAUSAL, lambda b, h, q, k: k <= q)


def full(seq_len, kv_len=None, batch=1):
    return MockBound("full", seq_len, kv_len or seq_len, batch, PRED_FULL,
                     lambda b, h, q, k: np.ones(np.broadcast_shapes(q.shape, k.shape), bool))


def sliding_window(seq_len, window, batch=1):
    return MockBound("sliding_window", seq_len, seq_len, batch, PRED_SLIDING,
                     lambda b, h, q, k: (k > q - window) & (k <= q), [np.array([window], np.int32)] * batch)


def document(seq_len, n_docs, batch=1, seed=0):
    """Per batch element its own random document boundaries (causal within each document)."""
    rng = np.random.default_rng(seed)
    tables = []
    for _ in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq_len), size=min(n_docs - 1, seq_len - 1), replace=False))
        doc = np.zeros(seq_len, np.int32)
        doc[cuts] = 1
        tables.append(np.cumsum(doc).astype(np.int32))
    return MockBound("document", seq_len, seq_len, batch, PRED_DOCUMENT,
                     lambda b, h, q, k: (k <= q) & (tables[b][np.minimum(k, seq_len - 1)] == tables[b][np.minimum(q, seq_len - 1)]),
                     tables)


def late_start(seq_len, first_row, batch=1):
    return MockBound("late_start", seq_len, seq_len, batch, PRED_LATE,
                     lambda b, h, q, k: (q >= first_row) & (k <= q), [np.array([first_row], np.int32)] * batch)


def per_head(seq_len, num_heads):
    return MockBound("per_head", seq_len, seq_len, 1, PRED_HEADS,
                     lambda b, h, q, k: (k <= q) & ((k + h) % 3 != 0), num_heads=num_heads)
