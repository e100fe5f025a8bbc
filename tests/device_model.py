"""A numpy model of the descriptor builder's kernels (templates/descriptor_kernels.cu.j2), step for step, so that the
CPU tests check the algorithm (windows and their carries, run starts paired with run ends, the capacity rule, the
column sweep 32 q_blocks at a time) against the host's descriptor before a GPU runs the CUDA. Each function names
the kernel it models; the per-thread chunks and block scans of the CUDA are sums here. Row intervals come from
the host's region analysis (maskc.analysis.intervals.region_ends), which the predicate's mask_row computes too.
The last part models how one kernel per view puts the rows' runs in place: the decoupled look-back under random
interleavings of its tiles and lanes, the last CTA's rewrite past the capacity, the work order's 32-bit keys."""
from __future__ import annotations

import numpy as np

from maskc.analysis.intervals import region_ends
from maskc.analysis.rows import RowValues

EMPTY, PARTIAL, FULL = 0, 1, 2
COST = np.array([0, 5, 4])


def row_slots(alo, ahi, dlo, dhi):
    """maskc_row_slots: sorted, disjoint, non-adjacent slots of one row (lists)."""
    pairs = sorted((a, b) for a, b in zip(alo, ahi) if a < b)     # insertion sort by lo (ties: any order)
    lo, hi = [], []
    for a, b in pairs:
        if lo and a <= hi[-1]:
            hi[-1] = max(hi[-1], b)
        else:
            lo.append(a)
            hi.append(b)
    for a, b in zip(dlo, dhi):
        if a >= b:
            continue
        nlo, nhi = [], []
        for x, y in zip(lo, hi):
            left, right = min(y, a), max(x, b)
            if x < left:
                nlo.append(x)
                nhi.append(left)
            if right < y:
                nlo.append(right)
                nhi.append(y)
        lo, hi = nlo, nhi
    return lo, hi


def intervals(ranges, params, seq_len, kv_len, head, b):
    """Per row q: (alo, ahi, dlo, dhi) half-open, as maskc_row_intervals gives them."""
    rows = RowValues(params, seq_len, kv_len, head, b, np.arange(seq_len, dtype=np.int64))
    ends = [[region_ends(r, rows, kv_len) for r in regions] for regions in (ranges.allow, ranges.deny)]

    def at(q):
        out = []
        for part in ends:
            lo = [int(l[q]) if ok[q] else 1 for l, h, ok in part]
            hi = [int(h[q]) if ok[q] else 0 for l, h, ok in part]
            out += [lo, hi]
        return out
    return at


def row_block(slots_of, q0, rows, heads, kv_len, block_n, kt, window):
    """maskc_row_block for one row block: (runs [(begin, end, kind)], cost, hull); slots_of(h, q) -> (lo, hi)."""
    h0, h1 = 2 ** 31 - 1, 0
    for h in range(heads):
        for q in range(q0, q0 + rows):
            lo, hi = slots_of(h, q)
            if lo:
                h0, h1 = min(h0, lo[0] // block_n), max(h1, (hi[-1] - 1) // block_n + 1)
    starts, ends, cost, carry = [], [], 0, EMPTY
    for w0 in range(h0, h1, window):
        wlen = min(window, h1 - w0)
        cls = np.zeros(wlen, np.int64)
        for h in range(heads):
            touch, cover = np.zeros(wlen + 1, np.int64), np.zeros(wlen + 1, np.int64)

            def add(diff, a, b):
                a, b = max(a, w0) - w0, min(b, w0 + wlen) - w0
                if a < b:
                    diff[a] += 1
                    diff[b] -= 1
            for q in range(q0, q0 + rows):
                for lo, hi in zip(*slots_of(h, q)):
                    add(touch, lo // block_n, (hi - 1) // block_n + 1)
                    c0 = 0 if lo == 0 else (lo - 1) // block_n + 1
                    c1 = kt if hi >= kv_len else hi // block_n
                    if c0 < c1:
                        add(cover, c0, c1)
            t, c = np.cumsum(touch)[:wlen], np.cumsum(cover)[:wlen]
            kind = np.where(c == rows, FULL, np.where(t > 0, PARTIAL, EMPTY))
            cls = kind if h == 0 else np.where(cls == kind, kind, PARTIAL)
        before = np.concatenate([[carry], cls[:-1]])
        change = cls != before
        starts += [(w0 + j, int(cls[j])) for j in np.flatnonzero(change & (cls != EMPTY))]
        ends += [w0 + j for j in np.flatnonzero(change & (before != EMPTY))]
        cost += int(COST[cls].sum())
        carry = int(cls[-1])
    if h0 < h1:
        ends.append(h1)
    assert len(starts) == len(ends)
    return [(s, e, k) for (s, k), e in zip(starts, ends)], cost, (h0, h1) if h0 < h1 else (0, 0)


def scan(counts, hulls, cap):
    """maskc_finish_view (maskc_overflow_view past the capacity), the view kernel's last CTA: (offsets, kept)."""
    counts = np.asarray(counts, np.int64)
    live = np.array([a < b for a, b in hulls], np.int64)
    kept = len(counts)
    if counts.sum() > cap:
        upto = np.cumsum(counts) + live.sum() - np.cumsum(live)
        kept = int((upto <= cap).sum())
        assert np.all(upto[:kept] <= cap) and np.all(upto[kept:] > cap), "the kept rows are a prefix"
    effective = np.where(np.arange(len(counts)) < kept, counts, live)
    offsets = np.concatenate([[0], np.cumsum(effective)]).astype(np.int32)
    assert offsets[-1] <= max(cap, 0) or kept == len(counts) and counts.sum() <= cap
    return offsets, kept


def column(runs_of_row, qt, kt, b, j):
    """maskc_column for column b * kt + j: (runs [(q_begin, q_end, kind)], cost, hull), 32 q_blocks at a time."""
    carry, starts, ends, cost, first, last = EMPTY, [], [], 0, -1, -1
    for i0 in range(0, qt, 32):
        kinds = []
        for lane in range(32):
            i = i0 + lane
            kind = EMPTY
            if i < qt:
                for begin, end, k in runs_of_row(b * qt + i):
                    if begin <= j < end:
                        kind = k
            kinds.append(kind)
        for lane, kind in enumerate(kinds):
            before = carry if lane == 0 else kinds[lane - 1]
            if kind != before and kind != EMPTY:
                starts.append((i0 + lane, kind))
            if kind != before and before != EMPTY:
                ends.append(i0 + lane)
            if kind != EMPTY:
                first = i0 + lane if first < 0 else first
                last = i0 + lane
            cost += int(COST[kind])
        carry = kinds[31]
    if carry != EMPTY:
        ends.append(qt)
    assert len(starts) == len(ends)
    return [(s, e, k) for (s, k), e in zip(starts, ends)], cost, (first, last + 1) if first >= 0 else (0, 0)


def view(items, cap):
    """A view from per-row (runs, cost, hull): offsets, runs, work order, kept (the scan, the write, the sort)."""
    offsets, kept = scan([len(r) for r, _, _ in items], [h for _, _, h in items], cap)
    runs, costs = [], []
    for i, (r, cost, (a, b)) in enumerate(items):
        if i < kept:
            runs += r
            costs.append(cost)
        else:
            runs += [(a, b, PARTIAL)] if a < b else []
            costs.append(5 * (b - a))
    return offsets, np.asarray(runs, np.int32).reshape(-1, 3), rank_order(costs), kept


def rank_order(costs):
    """maskc_order: row r at place (rows heavier than r) + (rows as heavy before r)."""
    costs = np.asarray(costs, np.int64)
    order = np.full(len(costs), -1, np.int32)
    for r, mine in enumerate(costs):
        order[int((costs > mine).sum() + (costs[:r] == mine).sum())] = r
    assert np.all(order >= 0), "the ranks are a permutation"
    return order


def build(bound, block_m, block_n, window=4096, caps=(10 ** 9, 10 ** 9)):
    """The device's descriptor of a host BoundMask (exact, linear): dict of the Descriptor's arrays and kept."""
    ranges = bound.mask.ranges
    S, K = bound.seq_len, bound.kv_len
    qt, kt = -(-S // block_m), -(-K // block_n)
    heads = (bound.num_heads or 1) if ranges.uses_head else 1
    rows = []
    for b, params in enumerate(bound.params.batch):
        per_head = [intervals(ranges, params, S, K, h, b) for h in range(heads)]

        def slots_of(h, q):
            return row_slots(*per_head[h](q))
        for i in range(qt):
            rows.append(row_block(slots_of, i * block_m, min(block_m, S - i * block_m), heads, K, block_n, kt,
                                  window))
    offsets, runs, order, kept = view(rows, caps[0])
    cols = [column(lambda r: runs[offsets[r]:offsets[r + 1]], qt, kt, b, j)
            for b in range(bound.batch) for j in range(kt)]
    col_offsets, col_runs, col_order, col_kept = view(cols, caps[1])
    return {"run_offsets": offsets, "runs": runs, "work_order": order, "col_offsets": col_offsets,
            "col_runs": col_runs, "col_work_order": col_order, "kept": (kept, col_kept)}


# -- the one-pass view kernels' protocol (maskc_rows_ / maskc_cols_): tiles, look-back, last CTA --------------

NOT_YET, AGGREGATE, INCLUSIVE = 0, 1, 2


def lookback_prefixes(counts, rng, lanes=32):
    """maskc_lookback for every tile under one random interleaving: tiles (taken in ticket order 0, 1, ...) count
    at their own pace, publish AGGREGATE | count, then read their predecessors' words ``lanes`` at a time, nearest
    first, each lane at its own moment once its word is published (a lane sees the word's state then), stop at the
    nearest INCLUSIVE, and publish INCLUSIVE | prefix. Returns each tile's exclusive prefix; fails if no tile can
    move while some are unfinished (a deadlock)."""
    n = len(counts)
    words = [(NOT_YET, 0)] * n
    state = [("count",)] * n          # ("count",) | ("look", look, before, seen {lane: word}) | ("done", before)
    while any(s[0] != "done" for s in state):
        movable = [t for t in range(n) if state[t][0] == "count" or (
            state[t][0] == "look" and any(words[state[t][1] - lane][0] != NOT_YET
                                          for lane in range(lanes) if state[t][1] - lane >= 0
                                          and lane not in state[t][3]))
            or (state[t][0] == "look" and len(state[t][3]) == sum(state[t][1] - lane >= 0 for lane in range(lanes)))]
        assert movable, "every unfinished tile waits: a deadlock"
        t = int(rng.choice(movable))
        if state[t][0] == "count":
            words[t] = (INCLUSIVE, counts[t]) if t == 0 else (AGGREGATE, counts[t])
            state[t] = ("done", 0) if t == 0 else ("look", t - 1, 0, {})
            continue
        _, look, before, seen = state[t]
        pending = [lane for lane in range(lanes) if look - lane >= 0 and lane not in seen]
        ready = [lane for lane in pending if words[look - lane][0] != NOT_YET]
        if ready:                        # one lane reads its word now
            lane = int(rng.choice(ready))
            state[t] = ("look", look, before, {**seen, lane: words[look - lane]})
            continue
        flags = [seen.get(lane, (INCLUSIVE, 0)) for lane in range(lanes)]   # lanes before tile 0: an inclusive 0
        nearest = next((lane for lane, (flag, _) in enumerate(flags) if flag == INCLUSIVE), lanes - 1)
        before += sum(value for _, value in flags[:nearest + 1])
        if flags[nearest][0] == INCLUSIVE:
            words[t] = (INCLUSIVE, before + counts[t])
            state[t] = ("done", before)
        else:
            state[t] = ("look", look - lanes, before, {})
    return [s[1] for s in state]


def one_pass_view(items, cap, rng, lanes=32):
    """A view as the one-pass kernel builds it (maskc_rows_ with maskc_finish_view): each row's runs written at
    its look-back prefix where they fit in ``cap`` (rows past it write nothing), then, past the capacity, the last
    CTA's rewrite (maskc_overflow_view: offsets from the kept prefix, one PARTIAL run over the hull of each row past
    it). Unwritten slots hold -1. Returns (offsets, runs written up to the view's end, kept)."""
    counts = [len(r) for r, _, _ in items]
    starts = lookback_prefixes(counts, rng, lanes)
    assert starts == list(np.cumsum([0] + counts[:-1])), "the look-back's prefixes are the exclusive sums"
    buffer = np.full((max(cap, 0), 3), -1, np.int64)
    for (runs, _, _), at in zip(items, starts):
        if runs and at + len(runs) <= cap:
            buffer[at:at + len(runs)] = runs
    total = sum(counts)
    offsets, kept = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), len(items)
    if total > cap:
        offsets, kept = scan(counts, [h for _, _, h in items], cap)
        for r in range(kept, len(items)):
            a, b = items[r][2]
            if a < b:
                buffer[offsets[r]] = (a, b, PARTIAL)
    return offsets, buffer[:offsets[-1]], kept


def rank_keys(costs):
    """maskc_rank_rows: the work order of at most 256 rows from 32-bit keys cost << 8 | 255 - r (every cost below
    2^23): row r at the number of keys above its own."""
    costs = np.asarray(costs, np.int64)
    assert len(costs) <= 256 and np.all(costs < 1 << 23)
    keys = (costs << 8) | (255 - np.arange(len(costs)))
    order = np.full(len(costs), -1, np.int32)
    for r, key in enumerate(keys):
        order[int((keys > key).sum())] = r
    return order
