"""The forward kernel on the GPU, on the real example masks (maskc.load(...).bind(...)), against float64
references: maskc.reference_attention (numpy, S <= 1000) and the same formula in torch float64 on the GPU
(every case), and against flex_attention fed bound.to_flex_block_mask(device="cuda") on the same inputs.

Every run: fresh random inputs, the output poisoned with NaN first (a NaN-filled block of O's size is
freed just before the call, so torch.empty in the runtime reuses it; we check that no NaN survives), ‖out − ref‖ / ‖ref‖ ≤ 1e-2 (bf16) or 5e-3 (fp16), LSE
likewise, rows without a visible key exactly O = 0 and LSE = -inf.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


from conftest import EXAMPLES, EXAMPLE_NAMES, example_params, gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("needs an NVIDIA GPU with CuPy and torch", allow_module_level=True)

import torch  # noqa: E402

import maskc  # noqa: E402
from maskc.runtime import state  # noqa: E402
from maskc.kernel_ir import ENGINES  # noqa: E402
from maskc.runtime import AttentionInputError, attention  # noqa: E402
from maskc.codegen.schedule import choose_tiles, forward_candidates  # noqa: E402
from gpu_support import EX, TOL, TORCH_DTYPE, bind, load, modify, poison, randn, rel  # noqa: E402


def reference(q, k, v, bound, scale, rows):
    """float64 O and LSE for the query rows `rows` (numpy int array) of every (b, h)."""
    B, Hq, S, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    rows_t = torch.as_tensor(rows, device="cuda")
    out = torch.zeros(B, Hq, len(rows), D, dtype=torch.float64, device="cuda")
    lse = torch.zeros(B, Hq, len(rows), dtype=torch.float64, device="cuda")
    for b in range(B):
        mb = b if bound.batch > 1 else 0
        vis_cache = {}
        for h in range(Hq):
            hm = h if bound.num_heads else 0
            if hm not in vis_cache:
                vis_cache[hm] = torch.as_tensor(np.ascontiguousarray(bound.dense(mb, hm)[rows]), device="cuda")
            vis = vis_cache[hm]
            s = (q[b, h, rows_t].double() @ k[b, h // rep].double().T) * scale
            s = modify(s, bound, b, h, rows).masked_fill(~vis, -math.inf)
            l = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - l[:, None]).nan_to_num(0.0)
            out[b, h] = p @ v[b, h // rep].double()
            lse[b, h] = l
    return out, lse


def check(bound, B, Hq, Hkv, D, dtype, rows=None, make=None, scale=None, against_numpy=None, flex=False):
    S, Skv = bound.seq_len, bound.kv_len
    if make is None:
        q, k, v = randn(B, Hq, S, D, dtype=dtype), randn(B, Hkv, Skv, D, dtype=dtype), randn(B, Hkv, Skv, D, dtype=dtype)
    else:
        q, k, v = make(B, Hq, Hkv, S, Skv, D, dtype)
    scale = scale or 1.0 / math.sqrt(D)
    torch.cuda.synchronize()
    poison((B, Hq, S, D), dtype)
    o, lse = attention(q, k, v, bound, scale=scale, return_lse=True)
    torch.cuda.synchronize()
    assert o.dtype == q.dtype and o.shape == (B, Hq, S, D) and lse.shape == (B, Hq, S)
    assert not torch.isnan(o).any(), "NaN in O (unwritten or -inf arithmetic)"
    assert not torch.isnan(lse).any(), "NaN in LSE"
    rows = np.arange(S) if rows is None else np.asarray(rows)
    ref_o, ref_lse = reference(q, k, v, bound, scale, rows)
    rows_t = torch.as_tensor(rows, device="cuda")
    got_o, got_lse = o[:, :, rows_t].double(), lse[:, :, rows_t].double()
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(got_lse) & (got_lse < 0), empty), "LSE = -inf exactly on rows with no key"
    assert (got_o[empty] == 0).all(), "rows with no visible key must be O = 0"
    err_o = rel(got_o, ref_o)
    fin = ~empty
    err_l = rel(got_lse[fin], ref_lse[fin]) if fin.any() else 0.0
    assert err_o <= TOL[dtype], f"O rel err {err_o:.2e}"
    assert err_l <= TOL[dtype], f"LSE rel err {err_l:.2e}"
    if against_numpy if against_numpy is not None else S <= 1000:
        ro, rl = maskc.reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                           v.double().cpu().numpy(), bound, scale=scale, return_lse=True)
        ro_t = torch.as_tensor(np.asarray(ro), device="cuda")
        assert rel(o.double(), ro_t) <= TOL[dtype], "O vs maskc.reference_attention"
        rl_t = torch.as_tensor(np.asarray(rl), device="cuda")
        assert torch.equal(torch.isneginf(rl_t), torch.isneginf(lse.double())), "empty rows vs reference_attention"
    if flex:
        from torch.nn.attention.flex_attention import flex_attention

        fo = flex_attention(q, k, v, block_mask=bound.to_flex_block_mask(device="cuda"), scale=scale,
                            enable_gqa=Hq != Hkv, score_mod=bound.flex_score_mod("cuda"))
        seen = ~torch.isneginf(lse)
        assert rel(o.double()[seen], fo.double()[seen]) <= 2 * TOL[dtype], "O vs flex_attention"
    return o, lse


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("S", [1, 127, 1000, 4097])
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example(name, S, D, dtype):
    """Every example at every length: GQA, batch 2 with different parameters per element (jagged lists)."""
    bound = bind(name, S, seed=S + D, batch=2 if load(name).params else None)
    flex = dtype == "bf16" and D == 128 and S <= 1000
    check(bound, B=2, Hq=4, Hkv=2, D=D, dtype=dtype, flex=flex)


@pytest.mark.parametrize("engine", [e for e in ENGINES if e != choose_tiles(128, "bf16").engine])
@pytest.mark.parametrize("D,dtype", [(64, "fp16"), (128, "bf16"), (256, "bf16")])
@pytest.mark.parametrize("S", [127, 4097])
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_other_engines(name, S, D, dtype, engine, monkeypatch):
    """The engines the schedule does not pick on this machine, among them the mma.sync kernel (the fallback
    where wgmma does not apply: other GPUs): every example, GQA, jagged batch."""
    monkeypatch.setenv("MASKC_ENGINE", engine)
    bound = bind(name, S, seed=S + D, batch=2 if load(name).params else None)
    check(bound, B=2, Hq=4, Hkv=2, D=D, dtype=dtype)


@pytest.mark.parametrize("name,params", [("causal", {}), ("document", {"docs": [2731] * 11 + [32768 - 2731 * 11]})])
def test_32k_against_flex(name, params):
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.cache_size_limit = 1000
    bound = load(name).bind(seq_len=32768, **params)
    q, k, v = (randn(1, 2, 32768, 128, dtype="bf16") for _ in range(3))
    poison((1, 2, 32768, 128), "bf16")
    o, lse = attention(q, k, v, bound, return_lse=True)
    fo, flse = torch.compile(flex_attention)(q, k, v, block_mask=bound.to_flex_block_mask(device="cuda"), return_lse=True)
    assert not torch.isnan(o).any()
    assert rel(o.double(), fo.double()) <= 2e-2
    assert rel(lse.double(), flse.double()) <= 1e-2


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_empty_rows_lse_neg_inf(dtype):
    # sliding window 50 over 300 keys: rows q >= 349 see nothing, and q_blocks 3.. have no runs at all
    bound = load("sliding_window").bind(seq_len=1000, kv_len=300, window=50)
    desc = bound.descriptor(128, 64)
    assert desc.run_offsets[4] == desc.run_offsets[3]
    o, lse = check(bound, B=1, Hq=2, Hkv=1, D=128, dtype=dtype)
    assert (o[:, :, 349:] == 0).all() and torch.isneginf(lse[:, :, 349:]).all()


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_device_predicate_equals_oracle(name):
    """mask_row/mask_visible in a tiny RawKernel fill an S x K table, equal to bound.dense()."""
    import cupy

    for S, seed in ((1, 0), (127, 1), (300, 2)):
        bound = bind(name, S, seed=seed)
        spec = bound.kernel_spec(head_dim=64, dtype="bf16")
        src = spec.predicate.source + r"""
extern "C" __global__ void table(const int* mask, unsigned char* out, int S, int K) {
    const int q = blockIdx.x;
    const MaskRow row = mask_row(mask, 0, 0, q);
    for (int k = threadIdx.x; k < K; k += blockDim.x) out[(long long)q * K + k] = mask_visible(row, mask, k) ? 1 : 0;
}
"""
        fn = cupy.RawKernel(src, "table", options=("--std=c++17",))
        desc = bound.descriptor(128, 64)
        data = cupy.asarray(np.asarray(desc.mask_data, np.int32))
        off = int(np.asarray(desc.mask_offsets)[0])
        out = cupy.zeros((S, bound.kv_len), cupy.uint8)
        fn((S,), (128,), (data[off:], out, np.int32(S), np.int32(bound.kv_len)))
        got = cupy.asnumpy(out).astype(bool)
        assert np.array_equal(got, bound.dense(0)), f"{name} S={S}: device predicate differs from dense()"


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_kv_len_differs(name):
    rng = np.random.default_rng(3)
    try:
        params = {"kv_len": 500, **example_params(name, 300, rng)}      # cross_images, tree_verify: their own
        bound = load(name).bind(seq_len=300, **params)
    except Exception as exc:
        pytest.skip(f"{name}: kv_len != seq_len not bindable ({exc})")
    check(bound, B=1, Hq=4, Hkv=1, D=64, dtype="bf16", against_numpy=False)


def test_head_dim_256():
    check(bind("hstu", 1000, seed=4), B=1, Hq=2, Hkv=1, D=256, dtype="bf16")


def test_strided_views():
    def make(B, Hq, Hkv, S, Skv, D, dtype):
        # q from a packed (B, S, 3, H, D) projection, k/v from a (B, Skv, H, 2, D) one: no copies
        qkv = randn(B, S, 3, Hq, D, dtype=dtype)
        kv = randn(B, Skv, Hkv, 2, D, dtype=dtype)
        return qkv[:, :, 1].transpose(1, 2), kv[:, :, :, 0].transpose(1, 2), kv[:, :, :, 1].transpose(1, 2)

    q, k, _ = make(1, 4, 2, 10, 10, 64, "bf16")
    assert not q.is_contiguous() and not k.is_contiguous()
    check(bind('causal', 1000), B=2, Hq=4, Hkv=2, D=128, dtype="bf16", make=make)


def test_cupy_inputs_return_cupy():
    import cupy

    bound = bind('causal', 300)
    q = cupy.random.standard_normal((1, 2, 300, 64), dtype=cupy.float32).astype(cupy.float16)
    k = cupy.random.standard_normal((1, 2, 300, 64), dtype=cupy.float32).astype(cupy.float16)
    v = cupy.random.standard_normal((1, 2, 300, 64), dtype=cupy.float32).astype(cupy.float16)
    o, lse = attention(q, k, v, bound, return_lse=True)
    assert isinstance(o, cupy.ndarray) and o.dtype == cupy.float16 and isinstance(lse, cupy.ndarray)
    qt, kt, vt = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    ref, _ = reference(qt, kt, vt, bound, 1 / 8, np.arange(300))
    assert rel(torch.as_tensor(o, device="cuda").double(), ref) <= TOL["fp16"]


def test_descriptor_uploaded_once_and_o_only():
    bound = bind('causal', 500)
    q, k, v = (randn(1, 2, 500, 64, dtype="bf16") for _ in range(3))
    o1 = attention(q, k, v, bound)
    o2 = attention(q, k, v, bound)
    assert torch.equal(o1, o2)   # deterministic


def test_a_new_bind_reuses_the_compiled_kernel(monkeypatch):
    """Lengths and parameters change at run time; the kernel must not be rebuilt or reloaded."""
    mask = maskc.load(EXAMPLES / "document.mask")
    first = mask.bind(seq_len=300, docs=[100, 200])
    q, k, v = (randn(1, 2, 300, 64, dtype="bf16") for _ in range(3))
    attention(q, k, v, first)
    loads = []
    real = state.load_kernel
    monkeypatch.setattr(state, "load_kernel", lambda src, options=None: loads.append(src) or real(src, options))
    second = mask.bind(seq_len=500, docs=[250, 250])
    q, k, v = (randn(1, 2, 500, 64, dtype="bf16") for _ in range(3))
    out = attention(q, k, v, second)
    assert loads == []
    ref = maskc.reference_attention(q, k, v, second)
    assert np.linalg.norm(out.double().cpu().numpy() - ref) / np.linalg.norm(ref) < 1e-2


def test_bad_inputs_raise():
    bound = bind('causal', 256)
    q, k, v = (randn(1, 2, 256, 64, dtype="bf16") for _ in range(3))
    cases = [
        (q.float(), k, v, "dtype"),
        (q[0], k, v, "4-D"),
        (q.cpu(), k, v, "CUDA"),
        (q, k.half(), v.half(), "dtypes differ"),
        (randn(1, 2, 255, 64, dtype="bf16"), k, v, "seq_len"),
        (q, randn(1, 2, 200, 64, dtype="bf16"), randn(1, 2, 200, 64, dtype="bf16"), "kv_len"),
        (randn(1, 2, 256, 96, dtype="bf16"), randn(1, 2, 256, 96, dtype="bf16"), randn(1, 2, 256, 96, dtype="bf16"), "head dim"),
        (randn(1, 3, 256, 64, dtype="bf16"), k, v, "multiple"),
        (randn(1, 2, 256, 68, dtype="bf16")[..., :64], k, v, "16 bytes"),
        (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, "contiguous"),
        (randn(2, 2, 256, 64, dtype="bf16"), k, v, "batch"),
    ]
    for qq, kk, vv, msg in cases:
        with pytest.raises(AttentionInputError, match=msg):
            attention(qq, kk, vv, bound)
    with pytest.raises(AttentionInputError, match="scale"):
        attention(q, k, v, bound, scale=-1.0)


def test_second_process_loads_cached_cubin(tmp_path):
    code = (
        "import sys; sys.path[:0] = [%r, %r]\n"
        "import maskc, torch\n"
        "from maskc.runtime import kernels as runtime\n"
        "q = torch.randn(1, 1, 200, 64, device='cuda', dtype=torch.bfloat16)\n"
        "runtime.attention(q, q, q, maskc.load(%r).bind(seq_len=200)); torch.cuda.synchronize()\n"
        "from maskc.runtime import loader\n"
        "print('COMPILED', [k.compiled for k in loader._kernels.values()])\n"
    ) % (str(Path(__file__).parent.parent), str(Path(__file__).parent), str(EX / "causal.mask"))
    env = dict(os.environ, MASKC_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "COMPILED [True]" in first.stdout, first.stdout + first.stderr
    assert "COMPILED [False]" in second.stdout, second.stdout + second.stderr
    assert list(tmp_path.glob("*.cubin"))




def test_autotune_picks_a_correct_kernel_and_remembers_it(tmp_path, monkeypatch):
    """MASKC_AUTOTUNE=1: the first call times every candidate (wrong ones are dropped), the output is right,
    and the choice is in <cache_dir>/autotune.json for the next call."""
    import json

    monkeypatch.setenv("MASKC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MASKC_AUTOTUNE", "1")
    check(bind("document", 1000, seed=3), B=1, Hq=2, Hkv=1, D=128, dtype="bf16")
    entries = json.loads((tmp_path / "autotune.json").read_text())
    (entry,) = entries.values()
    timed = {label: r for label, r in entry["report"].items() if isinstance(r, float)}
    assert entry["choice"] in timed and timed[entry["choice"]] == min(timed.values())
    assert len(entry["report"]) == len(forward_candidates(128, "bf16", state.capability(0, maskc.Options())))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name,params", [("causal", {}), ("document", {"docs": [1500, 97, 2500]})])
def test_running_maximum_that_grows_along_the_row(name, params, dtype):
    """O and LSE against float64 where each row's scores climb (or fall) steadily along the keys, at rates that
    raise a row's maximum by 1 to 40 (log2 units) per 128-key tile: the forward's lazy rescale (forward_tile's
    RESCALE_THRESHOLD, 8) keeps a row's running maximum for some tiles and moves it on others, within one warp
    and across the warps of a tile; falling rows keep their first tile's maximum throughout."""
    bound = load(name).bind(seq_len=4097, **params)
    D = 128
    # per-tile growth in log2 units of row i: alpha_i * (128 keys / 128) * scale * log2(e), scale = 1 / sqrt(D)
    per_tile = torch.tensor([1.0, 3.0, 7.0, 9.0, 15.0, 40.0, -5.0, 0.0], dtype=torch.float64)
    alphas = per_tile / (math.log2(math.e) / math.sqrt(D))

    def make(B, Hq, Hkv, S, Skv, D, dtype):
        g = torch.Generator(device="cuda").manual_seed(11)
        u = torch.nn.functional.normalize(torch.randn(D, device="cuda", generator=g), dim=0)
        rate = alphas.to("cuda", torch.float32)[torch.arange(S, device="cuda") % len(alphas)]
        q = rate[None, None, :, None] * u + 0.5 * torch.randn(B, Hq, S, D, device="cuda", generator=g)
        k = (torch.arange(Skv, device="cuda") / 128.0)[None, None, :, None] * u + 0.3 * torch.randn(
            B, Hkv, Skv, D, device="cuda", generator=g)
        v = torch.randn(B, Hkv, Skv, D, device="cuda", generator=g)
        return (x.to(TORCH_DTYPE[dtype]) for x in (q, k, v))

    check(bound, 1, 2, 2, D, dtype, make=make, against_numpy=False)


# Score modifiers whose scores fall with the distance from the diagonal, over masks whose row blocks have several
# runs (documents with global keys: the globals, a gap, the document's FULL tiles, the diagonal) or a run of
# PARTIAL tiles on the stored path (a 2-D neighbourhood): (source, bind arguments, the kernel's masking of PARTIAL
# tiles, the modifier as its definition says).
MODIFIERS_OVER_RUNS = {
    "docs": ("""mask alibi_docs(slope: float per h, docs: segments, globals: int)
  allow same(docs), k <= q
  allow k < globals
  score = score - slope * (q - k)
""", {"docs": [[1500, 97, 2500]], "globals": 200}, "", lambda s, slope, q, k: s - slope * (q - k)),
    "neighbourhood": ("""mask near_alibi(slope: float per h, width: int, window: int)
  allow abs(q // width - k // width) <= window, abs(q % width - k % width) <= window
  score = score - slope * abs(q - k)
""", {"width": 61, "window": 7}, "stored", lambda s, slope, q, k: s - slope * (q - k).abs()),
}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("case", sorted(MODIFIERS_OVER_RUNS))
def test_a_modifier_over_rows_of_several_runs(tmp_path, case, D, dtype):
    """A score modifier over row blocks of several runs and over the stored path's PARTIAL runs: O and LSE against
    float64 from the dense mask, with slopes that make the rows' scores climb steeply towards the diagonal (0.7 a
    key: each tile's maxima far above the last's) and hardly at all (2**-8). (Run 103 ran it with the tiles walked
    backwards, an experiment since reverted.)"""
    text, params, partial, modifier = MODIFIERS_OVER_RUNS[case]
    path = tmp_path / f"{case}.mask"
    path.write_text(text)
    mask, slopes, S = maskc.load(path), [0.7, 2.0 ** -8], 4097 if case == "docs" else 61 * 45
    plan = mask.kernel_source(maskc.Options(), head_dim=D).plan
    assert plan.partial_tiles == partial
    bound = mask.bind(seq_len=S, num_heads=2, slope=slopes, **params)
    q, k, v = (randn(1, 2, S, D, dtype=dtype) for _ in range(3))
    out, lse = attention(q, k, v, bound, return_lse=True)
    vis = torch.as_tensor(bound.dense(0), device="cuda")
    pos = torch.arange(S, device="cuda", dtype=torch.float64)
    for h, slope in enumerate(slopes):
        s = modifier((q[0, h].double() @ k[0, h].double().T) / math.sqrt(D), slope, pos[:, None], pos[None, :])
        s = s.masked_fill(~vis, -math.inf)
        assert rel(out[0, h].double(), torch.softmax(s, -1) @ v[0, h].double()) <= TOL[dtype]
        assert rel(lse[0, h].double(), torch.logsumexp(s, -1)) <= TOL[dtype]


@pytest.mark.parametrize("cap", [30.0, 50.0, 60.0])
def test_softcap_forward_where_tanh_saturates_both_ways(cap):
    """Softcap's forward (O and LSE) against float64 where every score of a row sits near +cap or near -cap: with
    caps up to FIXED_MAX_CAP the softmax runs against a fixed maximum, and these rows take its exponents to both
    ends of their range (P near 2**20 and near the smallest normal float); 60 runs the online softmax."""
    from maskc.codegen.plan import FIXED_MAX_CAP

    S, H, D = 1000, 2, 128
    bound = maskc.load(EX / "softcap.mask").bind(seq_len=S, cap=cap)
    assert bound.fixed_max == (cap <= FIXED_MAX_CAP)
    g = torch.Generator(device="cuda").manual_seed(3)
    u = torch.randn(D, device="cuda", generator=g)
    k = u + 0.01 * torch.randn(1, H, S, D, device="cuda", generator=g)          # every key about u
    q = 4.0 * torch.randn(1, H, S, D, device="cuda", generator=g)
    q[:, :, 0::3], q[:, :, 1::3] = -20.0 * u, 20.0 * u                      # rows against every key, and with
    v = torch.randn(1, H, S, D, device="cuda", generator=g)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    out, lse = maskc.attention(q, k, v, bound, return_lse=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
    s = (cap * torch.tanh(s / cap)).masked_fill(torch.ones(S, S, device="cuda", dtype=torch.bool).triu(1), -math.inf)
    assert rel(out.double(), torch.softmax(s, -1) @ v.double()) <= 1e-2
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max().item() <= 5e-2
