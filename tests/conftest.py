import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from maskc.analysis.bind import MAX_TABLE
from maskc.errors import MaskError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT))

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=600, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("MASKC_HYPOTHESIS", "ci"))


def gpu_available(with_torch: bool = False) -> bool:
    """Whether CuPy sees a CUDA device (and, ``with_torch``, torch does too)."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return False
        if with_torch:
            import torch
            return torch.cuda.is_available()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    # `slow` runs (long fuzzing, many threads) only when asked for: pytest -m slow
    if "slow" not in (config.getoption("markexpr") or ""):
        slow = pytest.mark.skip(reason="a long run: select it with -m slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    fuzz = sys.modules.get("test_fuzz_grammar")
    line = fuzz.summary() if fuzz is not None else None
    if line:
        terminalreporter.write_line(line)


def tile_truth(dense: np.ndarray, block_m: int, block_n: int) -> np.ndarray:
    """Tile classes by brute force from a dense mask: the oracle for classification."""
    s, k = dense.shape
    qt, kt = -(-s // block_m), -(-k // block_n)
    pad = np.zeros((qt * block_m, kt * block_n), np.int8)
    exists = np.zeros_like(pad, bool)
    pad[:s, :k] = dense
    exists[:s, :k] = True
    blocks = pad.reshape(qt, block_m, kt, block_n)
    real = exists.reshape(qt, block_m, kt, block_n)
    n_visible = blocks.sum(axis=(1, 3))
    n_pairs = real.sum(axis=(1, 3))
    return np.where(n_visible == 0, 0, np.where(n_visible == n_pairs, 2, 1)).astype(np.int8)


# Parameters for binding each example at a small length; tests parametrize over these. A mask that reads h
# (per_head_window) is bound with num_heads = heads, which the attention tests match to their query heads.
def example_params(name: str, seq_len: int, rng: np.random.Generator, heads: int = 4) -> dict:
    def split(total, parts):
        if parts <= 1 or total == 0:
            return [total]
        cuts = np.sort(rng.integers(0, total + 1, parts - 1))
        return [int(x) for x in np.diff(np.concatenate([[0], cuts, [total]]))]

    if name == "causal":
        return {}
    if name == "sliding_window":
        return {"window": int(rng.integers(1, seq_len + 2))}
    if name == "prefix_lm":
        return {"prefix": int(rng.integers(0, seq_len + 1))}
    if name in ("document", "bidirectional_document"):
        return {"docs": split(seq_len, int(rng.integers(1, 6)))}
    if name == "shared_prompt":
        prompt = int(rng.integers(0, seq_len + 1))
        return {"prompt": prompt, "responses": split(seq_len - prompt, int(rng.integers(1, 5)))}
    if name == "hstu":
        users = split(seq_len, int(rng.integers(1, 4)))
        context = int(rng.integers(0, 4))
        folded = max(context - 1, 0)
        while any(u < folded for u in users):
            context, folded = 0, 0
        targets = [int(rng.integers(0, u - folded + 1)) for u in users]
        return {"users": users, "context": context, "targets": targets,
                "max_attn_len": int(rng.choice([0, 1, 3, 17]))}
    if name == "clear":
        return {"text": int(rng.integers(0, seq_len + 1)), "width": int(rng.integers(1, 20)),
                "radius": int(rng.integers(0, 6))}
    if name == "global_local":
        return {"globals": int(rng.integers(0, 5)), "window": int(rng.integers(1, seq_len + 1))}
    if name == "neighborhood":
        width = int(rng.integers(1, 20))
        return {"width": width, "window": int(rng.integers(1, width + 1))}
    if name == "video":
        return {"width": int(rng.integers(1, 9)), "height": int(rng.integers(1, 7)),
                "radius": int(rng.integers(0, 4)), "past": int(rng.integers(0, 3))}
    if name == "morton_local":
        return {"radius": int(rng.integers(0, 6))}
    if name == "per_head_window":
        return {"num_heads": heads, "window": [int(w) for w in rng.integers(1, seq_len + 2, heads)]}
    if name == "cross_images":          # cross attention: kv_len (image tokens) differs from seq_len (text)
        kv_len = cross_kv_len(seq_len)
        images = int(rng.integers(1, 6))
        lead = int(rng.integers(0, seq_len // 4 + 1))
        return {"kv_len": kv_len, "lead": lead, "text": split(seq_len - lead, int(rng.integers(1, images + 2))),
                "images": split(kv_len, images)}
    if name == "tree_verify":           # a random tree of seq_len draft tokens after a cached prefix
        if seq_len * seq_len > MAX_TABLE:       # anc is seq_len x seq_len: token trees are short
            pytest.skip(f"tree_verify at {seq_len} draft tokens: anc would have {seq_len ** 2} entries, past "
                        f"maskc's {MAX_TABLE}")
        parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, seq_len)]
        anc = np.eye(seq_len, dtype=int)
        for i in range(seq_len):
            j = parent[i]
            while j >= 0:
                anc[i, j] = 1
                j = parent[j]
        return {"kv_len": tree_kv_len(seq_len), "anc": anc.tolist()}
    if name == "alibi":            # the paper's slopes, 2 ** (-8 (i + 1) / H), scaled at random
        return {"num_heads": heads, "slope": [float(rng.uniform(0.5, 2.0)) * 2 ** (-8 * (i + 1) / heads)
                                              for i in range(heads)]}
    if name == "softcap":
        return {"cap": float(rng.choice([0.5, 5.0, 50.0]))}
    if name == "block_diffusion":       # noised tokens [0, n), clean ones [n, 2n): seq_len is 2n or a prefix of it
        return {"n": int(rng.integers(-(-seq_len // 2), seq_len + 1)), "block": int(rng.integers(1, 24))}
    if name == "sliding_tile":          # a small video (tiles of up to 2 x 3 x 3 tokens, 1 to 3 a side), then text
        tile = [int(rng.integers(1, m + 1)) for m in (2, 3, 3)]
        tiles = [int(rng.integers(1, 4)) for _ in tile]
        video = int(np.prod(tile) * np.prod(tiles))
        return {**{f"tile_{a}": t for a, t in zip("thw", tile)}, **{f"tiles_{a}": n for a, n in zip("thw", tiles)},
                **{f"window_{a}": int(rng.integers(0, n + 2)) for a, n in zip("thw", tiles)},
                "text": int(rng.integers(0, max(seq_len - video, 0) + 3))}
    raise KeyError(name)


def cross_kv_len(seq_len: int) -> int:
    """cross_images' kv_len at seq_len (one per seq_len, so that a batch's elements share it)."""
    return seq_len + seq_len // 2 + 5


def tree_kv_len(seq_len: int) -> int:
    """tree_verify's kv_len at seq_len: a cached prefix, then the draft tokens."""
    return 2 * seq_len + 7


EXAMPLE_NAMES = sorted(p.stem for p in EXAMPLES.glob("*.mask"))


def example_score_mod(name: str, params: dict):
    """The score modifier of an example written from its definition (not from maskc): f(score, h, q, k) with
    h an int and the rest broadcasting numpy or torch values, or None for the examples without one."""
    if name == "alibi":
        slopes = params["slope"]
        return lambda s, h, q, k: s - slopes[h] * (q - k)
    if name == "softcap":
        cap = params["cap"]
        tanh = lambda x: x.tanh() if hasattr(x, "tanh") else np.tanh(x)  # noqa: E731
        return lambda s, h, q, k: cap * tanh(s / cap)
    return None
# Examples whose tile classes are sound but not exact (k enters through bit operations): lint warns about them.
SOUND_ONLY_EXAMPLES = ("morton_local", "tree_verify")
# Examples whose keys are another sequence than the queries (kv_len != seq_len): context parallelism, which
# shards one sequence, does not apply to them.
CROSS_EXAMPLES = ("cross_images", "tree_verify")


def batch_params(mask, name: str, seq_len: int, rng: np.random.Generator, batch: int, heads: int = 4,
                 **bind_kw) -> dict:
    """Parameters of ``batch`` elements as bind takes them (one list per parameter): each element's from
    example_params, the const ones the first element's for all (they are compiled into the kernel), an
    element those rule out (a window wider than the shared width, say) drawn again; num_heads (``heads``)
    once, for the whole batch."""
    per = [example_params(name, seq_len, rng, heads)]
    while len(per) < batch:
        p = {**example_params(name, seq_len, rng, heads), **{key: per[0][key] for key in mask.const_params}}
        try:
            mask.bind(seq_len=seq_len, **{**bind_kw, **p})
        except MaskError:
            continue
        per.append(p)
    return {key: per[0][key] if key in ("num_heads", "kv_len") else [p[key] for p in per] for key in per[0]}


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden from the templates as they are now (then review `git diff tests/golden`)")
