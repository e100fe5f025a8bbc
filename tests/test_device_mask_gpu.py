"""The descriptor built on the GPU (maskc.DeviceMask) against the host's (BoundMask.descriptor of the values the
device table holds), array for array with np.array_equal: every example the device takes at several lengths,
batches and tile shapes, random exact masks, values updated on the device; invalid values and a full run buffer
flagged and harmless; attention forward and backward through it; a CUDA graph that captures bind + forward +
backward once and replays it with new lengths; torch.compile with new values every step.

A mismatch names the array, the first row block (batch element, q_block) or column where the device and the
host differ, and both sides' runs (``describe_mismatch``).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import EXAMPLE_NAMES, EXAMPLES, batch_params, example_params, gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("needs an NVIDIA GPU with CuPy and torch", allow_module_level=True)

import torch  # noqa: E402

import maskc  # noqa: E402
from maskc.errors import MaskError  # noqa: E402
from maskc.runtime.device_builder import fixed_bytes  # noqa: E402
from gpu_support import randn, rel  # noqa: E402
from mask_strategies import binding, mask_text  # noqa: E402

LINEAR = [n for n in EXAMPLE_NAMES if maskc.load(EXAMPLES / f"{n}.mask").ranges.linear]
VIEWS = {"rows": ("run_offsets", "runs", "work_order"), "columns": ("col_offsets", "col_runs", "col_work_order")}
TILES = ((128, 128), (128, 64), (64, 128), (192, 128), (16, 16), (7, 13))


def load(name):
    return maskc.load(EXAMPLES / f"{name}.mask")


def describe_mismatch(got: dict, want, what: str) -> list[str]:
    """Every way the device's arrays ``got`` (DeviceMask.descriptor_arrays) differ from the host Descriptor
    ``want``: per view, the first row block or column whose runs differ (with both sides' runs), the first
    place the work orders differ; the table."""
    problems = []
    for view, (off, runs, order) in VIEWS.items():
        per = want.n_q_blocks if view == "rows" else want.n_kv_blocks
        go, gr, wo, wr = got[off], got[runs], getattr(want, off), getattr(want, runs)
        info = got["info" if view == "rows" else "col_info"].tolist()
        if not (np.array_equal(go, wo) and np.array_equal(gr, wr)):
            line = f"{what}: {view} differ (device info (kept, runs, overflowed) = {info}, host {len(wr)} runs)"
            if len(go) != len(wo):
                line += f"; offsets of {len(go)} rows against {len(wo)}"
            for r in range(min(len(go), len(wo)) - 1):
                a, b = gr[go[r]:go[r + 1]].tolist(), wr[wo[r]:wo[r + 1]].tolist()
                if a != b or go[r] != wo[r]:
                    line += (f"; first at {view[:-1]} {r} (batch element {r // per}, block {r % per}): offset "
                             f"{go[r]} vs {wo[r]}, device runs {a[:8]} host runs {b[:8]}")
                    break
            problems.append(line)
        go, wo = got[order], getattr(want, order)
        if not np.array_equal(go, wo):
            at = int(np.flatnonzero(go != wo)[0]) if len(go) == len(wo) else 0
            problems.append(f"{what}: {order} differs first at position {at}: device {go[at:at + 6].tolist()} host "
                            f"{wo[at:at + 6].tolist()}")
    for name in ("mask_data", "mask_offsets"):
        if not np.array_equal(got[name], getattr(want, name)):
            problems.append(f"{what}: {name}: device {got[name][:24].tolist()} host "
                            f"{getattr(want, name)[:24].tolist()}")
    return problems


def check_against_host(dm, tiles=TILES, what=""):
    """The device's descriptor at each tile shape equals the host's of the same values; no view overflowed."""
    host = dm.to_host()
    problems = []
    for bm, bn in tiles:
        got = dm.descriptor_arrays(bm, bn)
        problems += describe_mismatch(got, host.descriptor(bm, bn), f"{what or dm!r} at {bm}x{bn}")
        if got["info"][2] or got["col_info"][2]:
            problems.append(f"{dm!r} at {bm}x{bn}: a view overflowed (rows info {got['info'].tolist()}, columns "
                            f"{got['col_info'].tolist()})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", LINEAR)
def test_every_example_matches_the_host(name):
    mask, rng = load(name), np.random.default_rng(11)
    for seq_len in (1, 100, 1000, 4097):
        for batch in (None, 3):
            params = (example_params(name, seq_len, rng) if batch is None
                      else batch_params(mask, name, seq_len, rng, batch))
            kw = {k: params.pop(k) for k in ("num_heads", "kv_len") if k in params}
            dm = mask.bind_on_device(seq_len, **kw, max_segments=8, **params)
            check_against_host(dm, what=f"{name} seq_len={seq_len} batch={batch}")
            assert dm.status()["segments"] == [] and dm.status()["requires"] == []


def random_updates(name: str, seed: int, seq_len: int, max_segments: int, steps: int):
    """A device mask of example ``name`` (two batch elements) and, each step, new random values for it as update()
    takes them (segments and per-segment arrays as lists, the others as GPU tensors): yields (dm, step, values)."""
    mask, rng = load(name), np.random.default_rng(seed)
    first = batch_params(mask, name, seq_len, rng, 2)
    kw = {k: first.pop(k) for k in ("num_heads", "kv_len") if k in first}
    dm = mask.bind_on_device(seq_len, **kw, max_segments=max_segments, **first)
    for step in range(steps):
        new = batch_params(mask, name, seq_len, rng, 2)
        new = {k: v for k, v in new.items() if k not in kw and not mask.resolved.param(k).const}
        ragged = {k: v for k, v in new.items() if mask.resolved.param(k).kind in ("segments", "per")}
        yield dm, step, {**ragged, **{k: torch.as_tensor(np.asarray(v), device="cuda") for k, v in new.items()
                                      if k not in ragged}}


@pytest.mark.parametrize("name", ["document", "hstu", "shared_prompt", "cross_images", "per_head_window",
                                  "sliding_window", "block_diffusion"])
def test_updates_on_the_device_match_the_host(name):
    """New values every step, written as tensors on the GPU: each step's descriptor is the host's of them."""
    for dm, step, values in random_updates(name, 12, 3000, 6, 5):
        dm.update(**values)
        check_against_host(dm, ((128, 128), (64, 128), (16, 16)), f"{name} step {step}")


@pytest.mark.parametrize("name", ["document", "hstu", "shared_prompt"])
def test_rebuilt_views_of_many_tiles_match_the_host_every_time(name):
    """Each view is one kernel whose CTAs find where their runs go by looking back over the tiles before them
    (maskc_lookback) and whose last CTA completes the view: run it many times on views of 90-750 tiles, with new
    values each time (so new run counts), and every array must be the host's each time, including the look-back's
    reach past 32 tiles and the words it leaves zeroed for the next launch."""
    for dm, step, values in random_updates(name, 13, 6000, 8, 6):
        for _ in range(2):      # twice per value: the second build starts from the first one's zeroed words
            dm.update(**values)
            check_against_host(dm, ((16, 16), (32, 32), (128, 128)), f"{name} step {step}")


def test_long_sequences_and_windows_of_key_blocks():
    """Past 4096 key blocks a row block is counted a window at a time (16-key blocks at 100K keys: two
    windows); past 256 rows (or columns) a view's work order comes from the rank kernel, not its view kernel's
    last CTA, and past 65,536 from torch.sort (1-row blocks);
    and 128K tokens at 128 x 128."""
    for name, params in (("causal", {}), ("document", {"docs": [40000, 1, 59999]}),
                         ("hstu", {"users": [30000, 70000], "targets": [100, 7], "context": 3})):
        dm = load(name).bind_on_device(100000, **params)
        check_against_host(dm, ((1024, 16), (128, 128), (1, 4096)), f"{name} at 100000")
    dm = load("document").bind_on_device(131072, docs=[9000] * 14 + [5072], max_segments=16)
    check_against_host(dm, ((128, 128),), "document at 128K")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mask_text(exact=True), b=binding(max_len=300), shape=st.tuples(st.integers(1, 64), st.integers(1, 64)))
def test_random_exact_masks_match_the_host(text, b, shape):
    seq_len, kv_len, params = b
    try:
        mask = maskc.compile_mask(text)
        mask.bind(seq_len=seq_len, kv_len=kv_len, **params)
    except MaskError:
        assume(False)
    assume(mask.ranges.linear)
    dm = mask.bind_on_device(seq_len, kv_len, max_segments=6, **params)
    check_against_host(dm, (shape, (128, 128)), text)


def test_invalid_values_are_flagged_and_nothing_is_visible():
    mask = load("document")
    dm = mask.bind_on_device(256, docs=[100, 156], max_segments=4)
    q, k, v = (randn(1, 2, 256, 64, dtype="bf16") for _ in range(3))
    dm.update(docs=torch.tensor([100, 100], device="cuda"))          # 200 tokens of 256
    with pytest.raises(maskc.BindError, match="segments 'docs'"):
        dm.check()
    got = dm.descriptor_arrays(128, 128)
    assert got["run_offsets"][-1] == 0 and got["col_offsets"][-1] == 0
    out, lse = maskc.attention(q, k, v, dm, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    dm.update(docs=torch.tensor([56, 200], device="cuda"))
    dm.check()
    hstu = load("hstu").bind_on_device(100, users=[50, 50], targets=[1, 1], max_segments=2)
    hstu.update(targets=torch.tensor([60, 0], device="cuda"))       # more targets than the user has tokens
    with pytest.raises(maskc.BindError, match="requirement"):
        hstu.check()


CHECKED = [n for n in LINEAR if load(n).resolved.requires or any(p.kind == "segments" for p in load(n).params)]


@pytest.mark.parametrize("name", CHECKED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_validate_kernel_flags_exactly_what_bind_rejects(name, data):
    """Values that may be invalid (any lengths, integers of either sign, too many targets) written as tensors on
    the GPU: the update's one validate kernel writes the table that the host's pack_mask_data makes of them, and
    its status names a batch element and the rule or segments exactly where bind rejects them (the first such
    element); the same table and status again after an update back to valid values (the scratch words reset)."""
    from mask_strategies import perturbed

    mask, seq_len = load(name), 300
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    first = batch_params(mask, name, seq_len, rng, 3)
    kw = {k: first.pop(k) for k in ("num_heads", "kv_len") if k in first}
    dm = mask.bind_on_device(seq_len, **kw, max_segments=6, **first)
    new = perturbed(data.draw, mask, first, seq_len)
    for values in (new, first):
        ragged = lambda v: torch.nn.utils.rnn.pad_sequence(                    # noqa: E731
            [torch.tensor(e, dtype=torch.int64, device="cuda") for e in v], batch_first=True)
        dm.update(**{k: ragged(v) if mask.resolved.param(k).kind in ("segments", "per") else
                     torch.tensor(np.asarray(v), device="cuda") for k, v in values.items()})
        status = dm.status()
        table = dm.table.cpu().numpy().astype(np.int64)
        host_values = dm._table.host_values(table)
        rejected = []
        for b in range(dm.batch):
            one = {k: (v[b] if k not in ("seq_len", "kv_len", "num_heads") else v) for k, v in host_values.items()}
            try:
                mask.bind(**one)
            except maskc.BindError as e:
                rejected.append((b, e))
        assume(all("requirement not met" in str(e) or "segments" in str(e) for _, e in rejected))
        flagged = bool(status["segments"] or status["requires"])
        assert flagged == bool(rejected), (values, status, rejected)
        if rejected:
            assert status["batch_element"] == rejected[0][0], (status, rejected)
            b, e = rejected[0]
            if "requirement" in str(e) and not status["segments"]:
                assert any(mask.resolved.requires[i].span == e.span for i in status["requires"]), (status, e)


def test_values_past_32_bits_and_per_head_rules_are_flagged():
    """A tensor value past int32 sets the range bit (and is clamped in the table); a rule that reads h is checked
    for every head the mask is bound with."""
    mask = load("sliding_window")
    dm = mask.bind_on_device(256, window=[8, 8])
    dm.update(window=torch.tensor([8, 2 ** 33], device="cuda"))
    s = dm.status()
    assert s["range"] and s["batch_element"] == 1 and not s["segments"]
    with pytest.raises(maskc.BindError, match="32 bits"):
        dm.check()
    dm.update(window=torch.tensor([8, 9], device="cuda"))
    dm.check()
    heads = load("per_head_window").bind_on_device(256, num_heads=4, window=[4, 5, 6, 7])
    heads.check()
    heads.update(window=torch.tensor([4, 5, 6, 0], device="cuda"))        # only the last head's window fails
    with pytest.raises(maskc.BindError, match="requirement"):
        heads.check()


def test_a_full_run_buffer_is_flagged_and_attention_stays_right():
    """max_bytes too small for the runs: the last row blocks (and columns) become one PARTIAL run over their hull,
    check() says so, and forward and backward are still the mask's (the predicate masks the PARTIAL tiles)."""
    mask = load("causal")
    # half of it per view; at 64 x 128 tiles the row view has 8 row blocks: room for 8 runs where causal has 14
    dm = mask.bind_on_device(512, max_bytes=2 * (fixed_bytes(8) + 12 * 8))
    got = dm.descriptor_arrays(64, 128)
    # row blocks 0 and 1 keep their one run (then 6 hull runs fill the 8), the six others get one PARTIAL hull run
    assert got["info"].tolist()[:3] == [2, 8, 1], got["info"]
    assert got["runs"].tolist() == [[0, (64 * i + 63) // 128 + 1, 1] for i in range(8)]
    with pytest.raises(maskc.BindError, match="max_bytes"):
        dm.check()
    host = mask.bind(seq_len=512)
    q, k, v = (randn(1, 2, 512, 64, dtype="bf16").requires_grad_() for _ in range(3))
    dout = randn(1, 2, 512, 64, dtype="bf16")
    got = torch.autograd.grad(maskc.attention(q, k, v, dm), (q, k, v), dout)
    want = torch.autograd.grad(maskc.attention(q, k, v, host), (q, k, v), dout)
    for a, b in zip(got, want):
        assert rel(a.double(), b.double()) <= 2e-2


@pytest.mark.parametrize("name", ["document", "hstu", "per_head_window", "cross_images", "alibi"])
def test_attention_through_a_device_mask_is_the_host_masks(name):
    """The same descriptor arrays, so the same forward, bitwise; the backward within rounding (on wgmma_tma the
    host mask's deterministic dQ takes turns, the device mask's has its own kernel), and the device mask's
    deterministic backward bitwise repeatable."""
    mask, rng = load(name), np.random.default_rng(13)
    params = batch_params(mask, name, 1000, rng, 2)
    kw = {k: params.pop(k) for k in ("num_heads", "kv_len") if k in params}
    dm = mask.bind_on_device(1000, **kw, max_segments=6, **params)
    host = dm.to_host()
    hq = host.num_heads or 4
    q = randn(2, hq, 1000, 128, dtype="bf16").requires_grad_()
    k, v = (randn(2, hq // 2 if not host.num_heads else hq, host.kv_len, 128, dtype="bf16").requires_grad_()
            for _ in range(2))
    dout = randn(2, hq, 1000, 128, dtype="bf16")
    for deterministic in (True, False):
        outs = [maskc.attention(q, k, v, m, enable_gqa=True, deterministic=deterministic) for m in (dm, host)]
        assert torch.equal(outs[0], outs[1])
        grads = [torch.autograd.grad(o, (q, k, v), dout) for o in outs]
        for a, b in zip(*grads):
            assert rel(a.double(), b.double()) <= 1e-3
        if deterministic:
            again = torch.autograd.grad(maskc.attention(q, k, v, dm, enable_gqa=True, deterministic=True), (q, k, v),
                                        dout)
            assert all(torch.equal(a, b) for a, b in zip(grads[0], again))


def _random_docs(rng, seq_len, count):
    cuts = np.sort(rng.choice(np.arange(1, seq_len), count - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [seq_len]])).tolist()


@pytest.mark.parametrize("name", ["document", "hstu"])
def test_cuda_graph_captures_bind_forward_backward_and_replays_new_lengths(name):
    """One capture of update + forward + backward; each replay with new lengths written into the graph's input
    tensor gives what fresh eager runs give with a mask bound on the host to those lengths."""
    S, M, D = 2048, 8, 128
    mask, rng = load(name), np.random.default_rng(14)
    lengths = torch.zeros(M, dtype=torch.int32, device="cuda")
    targets = torch.zeros(M, dtype=torch.int32, device="cuda")

    def values(docs):
        return {"docs": docs} if name == "document" else {"users": docs, "targets": [min(3, d) for d in docs]}

    def write(docs):
        lengths.zero_()
        lengths[:len(docs)] = torch.tensor(docs)
        targets.zero_()
        targets[:len(docs)] = torch.tensor([min(3, d) for d in docs])

    first = _random_docs(rng, S, 3)
    dm = mask.bind_on_device(S, max_segments=M, **values(first))
    q, k, v = (randn(1, 4, S, D, dtype="bf16").requires_grad_() for _ in range(3))
    dout = randn(1, 4, S, D, dtype="bf16")

    def step():
        dm.update(**({"docs": lengths} if name == "document" else {"users": lengths, "targets": targets}))
        out = maskc.attention(q, k, v, dm)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    write(first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):                       # warm up: kernels loaded, buffers and launches made
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = step()
    for count in (1, 2, 5, 8, 3):
        docs = _random_docs(rng, S, count)
        write(docs)
        graph.replay()
        torch.cuda.synchronize()
        host = mask.bind(seq_len=S, **values(docs))
        out = maskc.attention(q, k, v, host)
        want = (out, *torch.autograd.grad(out, (q, k, v), dout))
        assert torch.equal(static[0], want[0]), (docs, rel(static[0].double(), want[0].double()))
        for a, b in zip(static[1:], want[1:]):
            assert rel(a.double(), b.double()) <= 1e-3, docs
        dm.check()


def test_torch_compile_new_values_every_step_compiles_once():
    """A compiled training step takes a device mask whose values change every step (update outside the compiled
    function or inside it): one graph, no recompile, no graph break, each step's gradients the eager ones."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    mask, rng = load("document"), np.random.default_rng(15)
    dm = mask.bind_on_device(1024, docs=[1024], max_segments=8)
    lengths = torch.zeros(8, dtype=torch.int32, device="cuda")

    def step(q, k, v, lengths):
        dm.update(docs=lengths)
        return (maskc.attention(q, k, v, dm) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True)
    q, k, v = (randn(1, 2, 1024, 64, dtype="bf16").requires_grad_() for _ in range(3))
    for count in (1, 3, 8, 2):
        docs = _random_docs(rng, 1024, count)
        lengths.zero_()
        lengths[:count] = torch.tensor(docs)
        got = torch.autograd.grad(compiled(q, k, v, lengths), (q, k, v))
        want = torch.autograd.grad((maskc.attention(q, k, v, mask.bind(seq_len=1024, docs=docs)) ** 2).sum(),
                                   (q, k, v))
        for a, b in zip(got, want):
            assert rel(a.double(), b.double()) <= 1e-2, docs
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"] and not counters["graph_break"], (dict(counters["recompiles"]),
                                                                         dict(counters["graph_break"]))
