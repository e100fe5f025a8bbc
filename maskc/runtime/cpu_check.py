"""Checks the ``maskc`` command makes without a GPU.

``maskc run`` on the CPU needs a second attention computation to hold against the float64 reference,
so that the error it reports compares two different things; ``maskc compile --check`` reads the
register count out of NVRTC's cubin.

``blocked_attention`` walks the descriptor the way the CUDA kernel does (EMPTY tiles skipped, FULL
tiles unmasked, PARTIAL tiles masked pair by pair) in float32; a wrong tile class or run shows up
as a large error against the dense float64 reference, which never looks at tiles.
``blocked_attention_backward`` does the same for the backward's dK/dV kernel: column block by column block
through the descriptor's transposed view, every query head of the GQA group in turn.
"""
from __future__ import annotations

import struct

import numpy as np


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to bf16 or fp16 (what the kernel would read), kept as float32."""
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000      # round to nearest even
    return rounded.astype(np.uint32).view(np.float32)


def blocked_attention(q, k, v, bound, block_m: int, block_n: int) -> np.ndarray:
    """Attention in float32 that walks the descriptor like the kernel: EMPTY tiles skipped, FULL tiles
    unmasked, PARTIAL tiles masked pair by pair. Compared with the dense float64 reference, it checks
    the tile classes and runs as well as the arithmetic."""
    desc = bound.descriptor(block_m, block_n)
    batch, heads, seq_len, dim = q.shape
    qt, scale = desc.n_q_blocks, np.float32(1.0 / np.sqrt(dim))
    out = np.zeros(q.shape, np.float32)
    for b in range(batch):
        mb = b if desc.batch > 1 else 0
        dense = None if bound.num_heads else bound.dense(mb)
        for h in range(heads):
            if bound.num_heads:                           # a mask that reads h: one mask per head
                dense = bound.dense(mb, h)
            for i in range(qt):
                rows = slice(i * block_m, min(seq_len, (i + 1) * block_m))
                cols, allowed = [], []
                for begin, end, kind in desc.runs[desc.run_offsets[mb * qt + i]:desc.run_offsets[mb * qt + i + 1]]:
                    c = np.arange(begin * block_n, min(bound.kv_len, end * block_n))
                    cols.append(c)
                    assert dense is not None                        # set per mask or per head above
                    allowed.append(dense[rows][:, c] if kind == 1 else np.ones((rows.stop - rows.start, c.size), bool))
                if not cols:
                    continue                            # a row block that sees no key: O = 0
                c, ok = np.concatenate(cols), np.concatenate(allowed, axis=1)
                scores = _modified(bound, (q[b, h, rows] @ k[b, h, c].T) * scale, mb, h, rows, c)[0]
                scores = np.where(ok, scores, -np.inf).astype(np.float32)
                peak = scores.max(axis=1, keepdims=True)
                seen = np.isfinite(peak)
                p = np.where(ok, np.exp(scores - np.where(seen, peak, 0)), 0).astype(np.float32)
                total = p.sum(axis=1, keepdims=True)
                out[b, h, rows] = np.where(seen, (p / np.where(total > 0, total, 1)) @ v[b, h, c], 0)
    return out


def blocked_attention_backward(q, k, v, dout, bound, block_m: int, block_n: int):
    """(dq, dk, dv) in float32 by the backward kernels' walk: for each key block, each query head of its GQA
    group, each transposed run's query blocks: P recomputed from the rows' LSE, masked on PARTIAL tiles only,
    delta = rowsum(dO * O). Blocks in no run are never visited."""
    from maskc.runtime.reference import reference_attention

    desc = bound.descriptor(block_m, block_n)
    batch, hq, seq_len, dim = q.shape
    group = hq // k.shape[1]
    kt, scale = desc.n_kv_blocks, np.float32(1.0 / np.sqrt(dim))
    q, k, v, dout = (np.asarray(x, np.float32) for x in (q, k, v, dout))
    out, lse = reference_attention(q, k, v, bound, return_lse=True)
    out, lse = out.astype(np.float32), lse.astype(np.float32)
    delta = (dout * out).sum(-1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(batch):
        mb = b if desc.batch > 1 else 0
        for column in range(mb * kt, (mb + 1) * kt):
            keys = slice((column % kt) * block_n, min(bound.kv_len, (column % kt + 1) * block_n))
            for h in range(hq):
                kv = h // group
                dense = bound.dense(mb, h if bound.num_heads else 0)
                for begin, end, kind in desc.col_runs[desc.col_offsets[column]:desc.col_offsets[column + 1]]:
                    rows = slice(begin * block_m, min(seq_len, end * block_m))
                    s, slope = _modified(bound, q[b, h, rows] @ k[b, kv, keys].T * scale, mb, h, rows, keys)
                    lse_rows = lse[b, h, rows, None]
                    seen = np.isfinite(lse_rows)
                    p = np.where(seen, np.exp(s - np.where(seen, lse_rows, 0)), 0).astype(np.float32)
                    if kind == 1:                                   # PARTIAL: the predicate decides
                        p = np.where(dense[rows, keys], p, 0)
                    dp = dout[b, h, rows] @ v[b, kv, keys].T
                    ds = p * (dp - delta[b, h, rows, None]) * slope.astype(np.float32)
                    dv[b, kv, keys] += p.T @ dout[b, h, rows]
                    dk[b, kv, keys] += ds.T @ q[b, h, rows] * scale
                    dq[b, h, rows] += ds @ k[b, kv, keys] * scale
    return dq, dk, dv


def _modified(bound, scores, batch_index: int, head: int, rows, cols):
    """The mask's score modifier on a block of scaled scores at query ``rows`` (a slice) and key ``cols`` (a
    slice or positions), in float32 as the kernels compute it, with its derivative (scores and 1 without one)."""
    from maskc.analysis.score import modified_scores

    resolved = bound.mask.resolved
    if resolved.score is None:
        return scores, np.ones(scores.shape, np.float32)
    positions = lambda p: np.arange(p.start, p.stop) if isinstance(p, slice) else p  # noqa: E731
    value, slope = modified_scores(resolved, bound.params.batch[batch_index], bound.seq_len, bound.kv_len, head,
                                   batch_index, np.asarray(scores, np.float64), positions(rows), positions(cols))
    return value.astype(np.float32), slope.astype(np.float32)


def relative_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64."""
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(out, np.float64) - ref) / max(np.linalg.norm(ref), 1e-300))


def cubin_registers(cubin: bytes) -> int | None:
    """Registers per thread of the cubin's first kernel (see :func:`cubin_registers_by_kernel`)."""
    regs = cubin_registers_by_kernel(cubin)
    return next(iter(regs.values())) if regs else None


def cubin_registers_by_kernel(cubin: bytes) -> dict[str, int]:
    """{kernel name: registers per thread}, from the cubin's ``.nv.info`` EIATTR_REGCOUNT records, each
    naming its function by symbol index into ``.symtab`` (no GPU needed). Empty if unreadable."""
    out = {}
    try:
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
        header = lambda i: struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize)  # noqa: E731
        section_names = header(names)[4]
        sections = [header(i) for i in range(count)]
        symtab = next(h for h in sections if h[1] == 2)          # SHT_SYMTAB; h[6] links its string table
        sym_strings = sections[symtab[6]][4]

        def symbol(index: int) -> str:
            name_at, = struct.unpack_from("<I", cubin, symtab[4] + index * 24)
            end = cubin.index(b"\0", sym_strings + name_at)
            return cubin[sym_strings + name_at:end].decode()

        for name_at, _, _, _, offset, size, *_ in sections:
            if not cubin[section_names + name_at:].startswith(b".nv.info"):
                continue
            p = offset
            while p + 4 <= offset + size:
                fmt, attr, value = struct.unpack_from("<BBH", cubin, p)
                p += 4
                if fmt == 0x04:                        # EIFMT_SVAL: `value` bytes of payload follow
                    if attr == 0x2F:                   # EIATTR_REGCOUNT: (function symbol, registers)
                        function, regs = struct.unpack_from("<II", cubin, p)
                        out[symbol(function)] = regs
                    p += value
    except (struct.error, StopIteration, ValueError, UnicodeDecodeError):
        return {}
    return out
