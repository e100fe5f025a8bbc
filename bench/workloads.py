"""The benchmark workloads and the peers maskc is measured against, shared by bench_fwd.py and bench_bwd.py.

A workload is a mask at a length: maskc binds the example file (``bound``); the peers get what their users
would write by hand, never anything maskc generated:

- ``flex`` / ``flex_fa4``: FlexAttention on its Triton backend and on its FlashAttention-4 backend
  (``kernel_options={"BACKEND": "FLASH"}``), with a hand-written ``mask_mod`` (``Workload.mask_mod``) and
  ``create_block_mask`` built once outside the timing;
- ``fa4``: ``flash_attn.cute.flash_attn_func`` where FA4 has the mask natively (causal, sliding window);
- ``fa4_varlen``: ``flash_attn_varlen_func`` for packed documents (causal within each document);
- ``cudnn``: SDPA's cuDNN backend, causal.

Effective TF/s counts visible pairs only: 4 * D * pairs * B * H per forward (the caller scales for backward).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import maskc  # noqa: E402

ALL_MASKS = ("causal", "sliding_window", "document", "shared_prompt", "hstu", "hstu_ctx32", "prefix_lm",
             "global_local", "clear", "neighborhood", "video")
SCORE_MASKS = ("softcap", "alibi")       # causal with a score modifier: compare with causal in the same run
SOFTCAP = 50.0
WINDOW = 1024
NATTEN_WIDTH, NATTEN_WINDOW = 181, 13                 # a 13x13 window on a 181-wide image: 181 x 181 ~ 32K
VIDEO_WIDTH, VIDEO_HEIGHT, VIDEO_RADIUS, VIDEO_PAST = 32, 32, 4, 1     # 32 x 32 frames, 9 x 9 x 2 window


@dataclass
class Workload:
    """One mask at one length: the maskc side (example file and bind parameters) and the peers' side."""

    name: str
    seq_len: int
    example: str
    params: dict
    tables: dict = field(default_factory=dict)    # per-token int tensors the hand-written mask_mod reads

    def bound(self):
        return _compiled(self.example).bind(seq_len=self.seq_len, **self.params)

    def short_params(self) -> dict:
        return {k: (v if not isinstance(v, list) or len(v) <= 4 else f"{len(v)} items") for k, v in self.params.items()}

    def score_mod(self):
        """The score modifier as a Flex user writes it, or None (the mask has none). It acts on the scaled score,
        as maskc's does."""
        if self.name == "softcap":
            return lambda score, b, h, q, k: SOFTCAP * torch.tanh(score / SOFTCAP)
        if self.name == "alibi":
            slopes = self.tables["slopes"]
            return lambda score, b, h, q, k: score - slopes[h] * (q - k)
        return None

    def mask_mod(self):
        """The mask as a Flex user writes it (closures over small per-token tables)."""
        t, name = self.tables, self.name
        if name in ("causal", "softcap", "alibi"):
            return lambda b, h, q, k: q >= k
        if name == "sliding_window":
            return lambda b, h, q, k: (q >= k) & (q - k < WINDOW)
        if name == "document":
            doc = t["doc"]
            return lambda b, h, q, k: (doc[q] == doc[k]) & (q >= k)
        if name == "shared_prompt":
            prompt, resp = self.params["prompt"], t["response"]
            return lambda b, h, q, k: (q >= k) & ((k < prompt) | ((resp[q] == resp[k]) & (resp[q] >= 0)))
        if name in ("hstu", "hstu_ctx32"):
            user, pos, n_hist = t["user"], t["pos"], t["n_hist"]
            context = self.params["context"]

            def hstu(b, h, q, k):
                same = user[q] == user[k]
                pq, pk = pos[q], pos[k]
                causal_part = same & ((q == k) | (pq > pk))
                if context == 0:
                    return causal_part
                return causal_part | (same & (pq == 0) & (pk < n_hist[k]))
            return hstu
        if name == "prefix_lm":
            prefix = self.params["prefix"]
            return lambda b, h, q, k: (k < prefix) | (q >= k)
        if name == "global_local":
            g, w = self.params["globals"], self.params["window"]
            return lambda b, h, q, k: (k < g) | (q < g) | ((q >= k) & (q - k < w))
        if name == "clear":
            text, width, radius = self.params["text"], self.params["width"], self.params["radius"]

            def clear(b, h, q, k):
                dy = (q - text) // width - (k - text) // width
                dx = (q - text) % width - (k - text) % width
                return (q < text) | (k < text) | (dy * dy + dx * dx < radius * radius)
            return clear
        if name == "neighborhood":
            # attention-gym's NATTEN: the window's centre clamped so that the window stays inside the image
            W, half = self.params["width"], self.params["window"] // 2
            rows = -(-self.seq_len // W)

            def natten(b, h, q, k):
                # the centre moved inward with where, not clamp: Flex-FA4's CuteDSL has no 'maximum' (run 34)
                qy, qx, ky, kx = q // W, q % W, k // W, k % W
                cy = torch.where(qy < half, half, torch.where(qy > rows - 1 - half, rows - 1 - half, qy))
                cx = torch.where(qx < half, half, torch.where(qx > W - 1 - half, W - 1 - half, qx))
                return (cy - ky <= half) & (ky - cy <= half) & (cx - kx <= half) & (kx - cx <= half)
            return natten
        if name == "video":
            W, Hh = self.params["width"], self.params["height"]
            r, past = self.params["radius"], self.params["past"]

            def video(b, h, q, k):
                tq, tk = q // (W * Hh), k // (W * Hh)
                dy, dx = (q // W) % Hh - (k // W) % Hh, q % W - k % W
                return (tk <= tq) & (tk >= tq - past) & (dy.abs() <= r) & (dx.abs() <= r)
            return video
        raise KeyError(name)

    def fa4_native(self):
        """kwargs of flash_attn_func for the masks FA4 has built in, else None."""
        if self.name == "causal":
            return {"causal": True}
        if self.name == "softcap":
            return {"causal": True, "softcap": SOFTCAP}
        if self.name == "sliding_window":
            return {"causal": True, "window_size": (WINDOW - 1, 0)}
        return None


@functools.lru_cache(maxsize=None)
def _compiled(example: str):
    return maskc.load(ROOT / "examples" / f"{example}.mask")


def workload(name: str, S: int, device: str = "cuda") -> Workload:
    """The benchmark's workloads at length S (random parts seeded)."""
    rng = np.random.default_rng(0)
    ar = torch.arange(S, device=device)
    if name == "causal":
        return Workload(name, S, "causal", {})
    if name == "sliding_window":
        return Workload(name, S, "sliding_window", {"window": WINDOW})
    if name == "softcap":
        return Workload(name, S, "softcap", {"cap": SOFTCAP})
    if name == "alibi":        # the paper's slopes for 16 heads (B, H of the benchmarks)
        slopes = [2 ** (-8 * (i + 1) / 16) for i in range(16)]
        return Workload(name, S, "alibi", {"num_heads": 16, "slope": slopes},
                        {"slopes": torch.tensor(slopes, dtype=torch.float32, device=device)})
    if name == "document":
        cuts = np.sort(rng.choice(np.arange(1, S), 11, replace=False))
        docs = [int(x) for x in np.diff(np.concatenate([[0], cuts, [S]]))]
        doc = torch.repeat_interleave(torch.arange(len(docs), device=device), torch.tensor(docs, device=device))
        return Workload(name, S, "document", {"docs": docs}, {"doc": doc, "cu_seqlens": torch.tensor(
            np.concatenate([[0], np.cumsum(docs)]), dtype=torch.int32, device=device)})
    if name == "shared_prompt":
        prompt = S // 4
        r = (S - prompt) // 4
        responses = [r, r, r, S - prompt - 3 * r]
        resp = torch.full((S,), -1, dtype=torch.int64, device=device)
        resp[prompt:] = torch.repeat_interleave(torch.arange(4, device=device), torch.tensor(responses, device=device))
        return Workload(name, S, "shared_prompt", {"prompt": prompt, "responses": responses}, {"response": resp})
    if name in ("hstu", "hstu_ctx32"):
        u = S // 4
        users = [u, u, u, S - 3 * u]
        targets = [x // 10 for x in users]
        context = 32 if name == "hstu_ctx32" else 0
        return Workload(name, S, "hstu", {"users": users, "targets": targets, "context": context},
                        hstu_tables(users, targets, context, device))
    if name == "prefix_lm":
        return Workload(name, S, "prefix_lm", {"prefix": S // 4})
    if name == "global_local":
        return Workload(name, S, "global_local", {"globals": 4, "window": 512})
    if name == "clear":
        return Workload(name, S, "clear", {"text": 512, "width": 128, "radius": 16})
    if name == "neighborhood":
        return Workload(name, S, "neighborhood", {"width": NATTEN_WIDTH, "window": NATTEN_WINDOW})
    if name == "video":
        return Workload(name, S, "video", {"width": VIDEO_WIDTH, "height": VIDEO_HEIGHT, "radius": VIDEO_RADIUS,
                                           "past": VIDEO_PAST})
    raise KeyError(name)


def hstu_tables(users, targets, context: int, device: str = "cuda") -> dict:
    """The per-token tables the hand-written hstu mask_mod reads (user index, position with the context folded
    and the targets merged, the user's history length), for users of these lengths and target counts."""
    folded = max(context - 1, 0)
    starts = np.concatenate([[0], np.cumsum(users)[:-1]])
    user = np.repeat(np.arange(len(users)), users)
    n_hist = np.repeat(np.array(users) - folded - np.array(targets), users)
    pos = np.clip(np.arange(sum(users)) - np.repeat(starts, users) - folded, 0, n_hist)
    return {k: torch.tensor(v, device=device) for k, v in (("user", user), ("pos", pos), ("n_hist", n_hist))}


def jagged_users(S: int, count: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(user lengths, target counts) of one packed HSTU batch: ``count`` users of random lengths filling S (cuts
    drawn as the document workload's), each with 0 to a fifth of its tokens as targets (10% on average, as the
    hstu workload's)."""
    cuts = np.sort(rng.choice(np.arange(1, S), count - 1, replace=False))
    users = [int(x) for x in np.diff(np.concatenate([[0], cuts, [S]]))]
    return users, [int(rng.integers(0, u // 5 + 1)) for u in users]


def dense_mask(w: Workload, rows: int | None = None) -> torch.Tensor:
    """bool[rows, S] of the hand-written mask_mod, for a float32 reference at small sizes."""
    S = w.seq_len
    q = torch.arange(rows or S, device="cuda")[:, None]
    k = torch.arange(S, device="cuda")[None, :]
    zero = torch.zeros((), dtype=torch.int64, device="cuda")
    return w.mask_mod()(zero, zero, q, k)


def reference(q, k, v, mask: torch.Tensor, scale: float | None = None, score_mod=None) -> torch.Tensor:
    """softmax(mod(QK^T * scale) + mask) V in float32, head by head (rows that see nothing give 0); ``score_mod``
    as Flex takes it (a Workload's), applied to the scaled scores."""
    D = q.shape[-1]
    scale = scale if scale is not None else D ** -0.5
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h].float() @ k[b, h].float().T) * scale
            if score_mod is not None:
                rows = torch.arange(s.shape[0], device=s.device)[:, None]
                cols = torch.arange(s.shape[1], device=s.device)[None, :]
                s = score_mod(s, torch.tensor(b, device=s.device), torch.tensor(h, device=s.device), rows, cols)
            s = s.masked_fill(~mask, float("-inf"))
            p = torch.softmax(s, -1).nan_to_num(0.0)
            out[b, h] = p @ v[b, h].float()
    return out


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("nan")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def flex_functions():
    """(flex on Triton, flex on FA4 or None when FA4 is not importable), compiled, with dynamo's caches raised:
    a sweep over shapes and mask_mods otherwise falls back to Flex's unfused path after a few recompiles."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.cache_size_limit = 1000
    torch._dynamo.config.accumulated_cache_size_limit = 1000
    flex = torch.compile(flex_attention, dynamic=False)
    flex_fa4 = torch.compile(functools.partial(flex_attention, kernel_options={"BACKEND": "FLASH"}), dynamic=False) \
        if fa4_module() is not None else None
    return flex, flex_fa4


@functools.lru_cache(maxsize=1)
def fa4_module():
    try:
        import flash_attn.cute as fa4
        return fa4
    except Exception as exc:   # noqa: BLE001 - any import failure means: no FA4 on this machine
        print(f"# FA4 not available: {exc!r}", flush=True)
        return None


def first(x):
    return x[0] if isinstance(x, tuple) else x


# ---- what the backward and overhead benchmarks share --------------------------------------------------------

B, H, D = 1, 16, 128      # batch, heads, head dim of bench_bwd.py, bwd_variants.py and bench_overhead.py


def real_bound(name: str, S: int):
    """The workload's bound mask (maskc's side)."""
    return workload(name, S).bound()


def count_pairs(bound) -> int:
    """Visible pairs: from the row intervals for exact masks, else the mask_mod on the GPU in row chunks."""
    try:
        return int(bound.visible_pairs())
    except NotImplementedError:
        mod = bound.flex_mask_mod("cuda")
        kk = torch.arange(bound.kv_len, device="cuda")[None, :]
        zero = torch.zeros((), dtype=torch.int64, device="cuda")
        total = 0
        for r0 in range(0, bound.seq_len, 1024):
            qq = torch.arange(r0, min(bound.seq_len, r0 + 1024), device="cuda")[:, None]
            total += int(mod(zero, zero, qq, kk).sum().item())
        return total


def bench_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of triton.testing.do_bench."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def compiled_flex():
    """(flex_attention compiled on its Triton backend, GPU name, UTC date)."""
    import datetime

    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return flex_functions()[0], torch.cuda.get_device_name(), date


def write_records(path, records) -> None:
    import json

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
