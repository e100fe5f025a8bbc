"""The descriptor built on the device (maskc.DeviceMask), what a CPU can check: the builder renders and compiles
for every mask it takes and every target; its algorithm (tests/device_model.py, the kernels step for step) gives
the host's descriptor; the parameter table is pack_mask_data's and follows updates; errors are clear. The GPU
runs the kernels themselves in tests/test_device_mask_gpu.py."""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import maskc
from maskc.analysis.descriptor import unpack
from maskc.codegen.descriptor_build import builder_spec, emit_descriptor_builder, unsupported
from maskc.codegen.predicate import pack_mask_data
from maskc.codegen.schedule import ARCHES
from maskc.errors import MaskError
from maskc.kernel_ir import EMPTY, FULL, PARTIAL

import device_model
from conftest import EXAMPLE_NAMES, EXAMPLES, batch_params, example_params
from mask_strategies import binding, mask_text, perturbed, q_expr, tile_shape
from host_cxx import build_library, needs_gxx
from test_predicate import SHIM

torch = pytest.importorskip("torch")

LINEAR = [n for n in EXAMPLE_NAMES if maskc.load(EXAMPLES / f"{n}.mask").ranges.linear]
ARRAYS = ("run_offsets", "runs", "work_order", "col_offsets", "col_runs", "col_work_order")


def _load(name):
    return maskc.load(EXAMPLES / f"{name}.mask")


def test_the_linear_examples_are_those_the_device_takes():
    assert len(LINEAR) >= 12 and {"causal", "document", "hstu", "shared_prompt", "cross_images"} <= set(LINEAR)
    for name in EXAMPLE_NAMES:
        reason = unsupported(_load(name).ranges)
        assert (reason is None) == (name in LINEAR), (name, reason)


# -- the CUDA: rendered from the predicate, compiled by NVRTC for every target ----------------------------

def _compile(job):
    from maskc.codegen.emit import compile_to_cubin
    name, arch = job
    mask = _load(name)
    return name, arch, len(compile_to_cubin(emit_descriptor_builder(builder_spec(
        mask.name, mask.ranges, mask.const_values(), arch=arch, resolved=mask.resolved))))


def test_builder_compiles_for_every_linear_example_and_target():
    pytest.importorskip("cupy")
    jobs = [(n, arch) for n in LINEAR for arch in ARCHES + ("compute_80",)]
    with ProcessPoolExecutor(2) as pool:
        built = list(pool.map(_compile, jobs))
    assert len(built) == len(jobs) and all(size > 0 for _, _, size in built)


@pytest.mark.parametrize("name", LINEAR)
def test_builder_reads_every_region_interval_of_the_predicate(name):
    """The builder's intervals are the predicate's mask_row fields, one per region, allow then deny: the mask's
    logic is the predicate's code, placed verbatim."""
    mask = _load(name)
    spec = builder_spec(mask.name, mask.ranges, mask.const_values())
    src = emit_descriptor_builder(spec).source
    assert spec.predicate.source in src
    regions = len(mask.ranges.allow) + len(mask.ranges.deny)
    for i in range(regions):
        assert f"row.lo{i}" in src and f"row.hi{i}" in src
    assert f"row.lo{regions}" not in src
    segments = [p.name for p in mask.ranges.params if p.kind == "segments"]
    assert [c.name for c in spec.segments] == segments
    assert src.count("maskc_bad_segments(mask + mask[") == len(segments)
    assert set(spec.entries) == {f"maskc_{k}_{spec.mask_name}" for k in
                                 ("validate", "rows", "cols", "order")}
    assert all('extern "C" __global__' in src.split(entry)[0][-200:] for entry in spec.entries)


def test_masks_the_device_cannot_classify_are_refused():
    for name, words in (("clear", "chunked"), ("morton_local", "sound")):
        mask = _load(name)
        with pytest.raises(maskc.BindError, match=words):
            mask.bind_on_device(seq_len=600, **example_params(name, 600, np.random.default_rng(0)))


# -- the algorithm, modelled on the CPU, against the host ---------------------------------------------------

def _check_model(bound, block_m, block_n, window):
    want = bound.descriptor(block_m, block_n)
    got = device_model.build(bound, block_m, block_n, window)
    for name in ARRAYS:
        assert np.array_equal(got[name], getattr(want, name)), (name, block_m, block_n)


@pytest.mark.parametrize("name", LINEAR)
def test_model_of_the_kernels_gives_the_hosts_descriptor(name):
    mask = _load(name)
    rng = np.random.default_rng(5)
    for seq_len, batch, (bm, bn), window in ((1, None, (16, 16), 4096), (45, 2, (7, 5), 2), (130, None, (32, 16), 3),
                                             (97, 3, (64, 128), 1)):
        params = (example_params(name, seq_len, rng) if batch is None
                  else batch_params(mask, name, seq_len, rng, batch))
        _check_model(mask.bind(seq_len=seq_len, **params), bm, bn, window)


@given(text=mask_text(exact=True), b=binding(max_len=60), shape=tile_shape, window=st.integers(1, 6))
def test_model_of_the_kernels_on_random_masks(text, b, shape, window):
    try:
        mask = maskc.compile_mask(text)
        seq_len, kv_len, params = b
        bound = mask.bind(seq_len=seq_len, kv_len=kv_len, **params)
    except MaskError:
        assume(False)
    assume(mask.ranges.linear)
    _check_model(bound, *shape, window)


@given(name=st.sampled_from(LINEAR), seed=st.integers(0, 10 ** 6), caps=st.tuples(st.integers(0, 40),
                                                                                  st.integers(0, 40)))
def test_model_past_the_capacity_is_sound(name, seed, caps):
    """Runs past a view's capacity: the last rows become one PARTIAL run over their hull, the total stays within
    the capacity (at least one run per row and column), and the classes stay sound (FULL only where the host
    says FULL, EMPTY where it says EMPTY)."""
    mask, rng = _load(name), np.random.default_rng(seed)
    bound = mask.bind(seq_len=90, **example_params(name, 90, rng))
    bm, bn = 16, 8
    want = bound.descriptor(bm, bn)
    rows, cols = want.run_offsets.size - 1, want.col_offsets.size - 1
    caps = (rows + caps[0], cols + caps[1])
    got = device_model.build(bound, bm, bn, 4, caps)
    assert got["run_offsets"][-1] <= caps[0] and got["col_offsets"][-1] <= caps[1]
    host = unpack(want)
    for offsets, runs, transpose in (("run_offsets", "runs", False), ("col_offsets", "col_runs", True)):
        grid = np.zeros(host.shape[1:] if not transpose else host.shape[:0:-1], np.int8)
        for r in range(got[offsets].size - 1):
            for begin, end, kind in got[runs][got[offsets][r]:got[offsets][r + 1]]:
                grid[r, begin:end] = kind
        if transpose:
            grid = grid.T
        assert np.all((grid != FULL) | (host[0] == FULL)) and np.all((grid != EMPTY) | (host[0] == EMPTY))
    if got["kept"][0] == rows:                  # rows within the capacity: exact (and the columns made from them)
        assert np.array_equal(got["runs"], want.runs)
        if got["kept"][1] == cols:
            assert np.array_equal(got["col_runs"], want.col_runs)


# -- the parameter table -----------------------------------------------------------------------------------

def _padded_bind(mask, seq_len, params, capacity):
    from maskc.runtime.device_table import pad_segments
    return mask.bind(seq_len=seq_len, **pad_segments(mask.resolved, params, capacity))


@pytest.mark.parametrize("name", LINEAR)
def test_table_is_pack_mask_data_of_the_padded_values_and_follows_updates(name):
    mask, rng = _load(name), np.random.default_rng(3)
    segs = [p.name for p in mask.params if p.kind == "segments"]
    first = batch_params(mask, name, 64, rng, 2)
    kw = {k: first.pop(k) for k in ("num_heads", "kv_len") if k in first}
    dm = mask.bind_on_device(64, device="cpu", max_segments=7, **kw, **first)
    capacity = {s: 7 for s in segs}
    want = _padded_bind(mask, 64, {**kw, **first}, capacity)
    assert np.array_equal(dm.table.numpy().reshape(-1), pack_mask_data(mask.ranges, want.params)[0])
    for _ in range(3):
        new = batch_params(mask, name, 64, rng, 2)
        for k in ("num_heads", "kv_len"):
            new.pop(k, None)
        new = {k: v for k, v in new.items() if not mask.resolved.param(k).const}
        ragged = {k for k, v in new.items() if mask.resolved.param(k).kind in ("segments", "per")}
        dm.update(**{k: v for k, v in new.items() if k in ragged})         # lists of lists: padded with empty segments
        dm.update(**{k: torch.from_numpy(np.asarray(v)) for k, v in new.items() if k not in ragged})
        want = _padded_bind(mask, 64, {**kw, **first, **new}, capacity)
        assert np.array_equal(dm.table.numpy().reshape(-1), pack_mask_data(mask.ranges, want.params)[0]), new
        host = dm.to_host()
        for b in range(want.batch):
            assert np.array_equal(host.dense(b), want.dense(b))


def test_a_changed_origin_moves_the_segments_and_keeps_their_lengths():
    mask = _load("shared_prompt")
    dm = mask.bind_on_device(100, prompt=40, responses=[30, 30], max_segments=4, device="cpu")
    dm.update(prompt=torch.tensor(10), responses=torch.tensor([45, 45]))
    assert dm.to_host().params.batch[0].segment("responses").bounds.tolist() == [10, 55, 100, 100, 100]
    dm.update(prompt=torch.tensor(20))          # the lengths stay: they no longer reach seq_len
    with pytest.raises(maskc.BindError, match="responses"):
        dm.check()


def test_update_errors_name_the_parameter():
    mask = _load("hstu")
    dm = mask.bind_on_device(50, users=[20, 30], targets=[2, 3], max_segments=3, device="cpu")
    with pytest.raises(maskc.BindError, match="max_segments = 3"):
        dm.update(users=torch.tensor([10, 10, 10, 20]))
    with pytest.raises(maskc.BindError, match="no parameter 'user'"):
        dm.update(user=torch.tensor([50]))
    with pytest.raises(maskc.BindError, match="shape"):
        dm.update(context=torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(maskc.BindError, match="32 bits"):
        dm.update(context=2 ** 40)
    with pytest.raises(maskc.BindError, match="max_segments = 1"):
        mask.bind_on_device(50, users=[20, 30], targets=[2, 3], max_segments=1, device="cpu")
    with pytest.raises(maskc.BindError, match="positive integer"):
        mask.bind_on_device(50, users=[50], targets=[2], max_segments=0, device="cpu")
    with pytest.raises(maskc.BindError, match="not a segments parameter"):
        mask.bind_on_device(50, users=[50], targets=[2], max_segments={"docs": 4}, device="cpu")
    with pytest.raises(maskc.BindError, match="const"):
        _load("clear").bind_on_device(600, device="cpu").update(text=torch.tensor(3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without a CUDA GPU")
def test_binding_on_the_device_without_a_gpu_says_so_and_names_the_cpu_path():
    for device in (None, "cuda", "cuda:0"):
        with pytest.raises(maskc.BindError, match=r"needs a CUDA GPU[\s\S]*device=\"cpu\""):
            _load("document").bind_on_device(seq_len=64, docs=[64], max_segments=64, device=device)


CHECKED = [n for n in LINEAR if _load(n).resolved.requires or any(p.kind == "segments" for p in _load(n).params)]

CHECK_LOOP = """
extern "C" void maskc_checks(const int* data, const int* offsets, int batch, int heads, int lanes, int* out) {
    for (int b = 0; b < batch; ++b) {
        int segments = 0, requires = 0;
        for (int lane = 0; lane < lanes; ++lane) {
            const MaskChecks c = maskc_check_element(data + offsets[b], b, heads, lane, lanes);
            segments |= c.segments;
            requires |= c.requires;
        }
        out[2 * b] = segments;
        out[2 * b + 1] = requires;
    }
}
"""
def _checks_lib(mask):
    """The builder's checks of ``mask`` (emit_checks: what its validate kernel runs per batch element), compiled
    by g++ with the predicate tests' shim."""
    from maskc.codegen.descriptor_build import emit_checks

    source = emit_checks(builder_spec(mask.name, mask.ranges, mask.const_values(), resolved=mask.resolved))
    lib = build_library(SHIM + source + CHECK_LOOP, "the checks")
    lib.maskc_checks.restype = None
    return lib


def _device_checks(mask, dm, lanes: int) -> np.ndarray:
    """[B, 2]: each batch element's segment bits and rule bits, as the validate kernel finds them in ``dm``'s
    table (here the CPU's: DeviceTable.apply, the kernel's torch model), in ``lanes`` interleaved parts."""
    import ctypes

    data = np.ascontiguousarray(dm.table.numpy().reshape(-1), np.int32)
    offsets = np.ascontiguousarray(dm._table.offsets.numpy(), np.int32)
    out = np.zeros((dm.batch, 2), np.int32)
    heads = (dm.num_heads or 1) if mask.ranges.uses_head else 1
    ptr = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_int))     # noqa: E731
    _checks_lib(mask).maskc_checks(ptr(data), ptr(offsets), ctypes.c_int(dm.batch), ctypes.c_int(heads),
                                   ctypes.c_int(lanes), ptr(out))
    return out


@needs_gxx
@pytest.mark.parametrize("name", CHECKED)
@given(data=st.data())
def test_emitted_checks_flag_exactly_what_bind_rejects(name, data):
    """The builder's emitted checks (the `require` rules at bind's positions, for every head; segments that do
    not partition their range), compiled by g++, against the host's bind of the same table: they flag a batch
    element exactly where bind rejects it, the rule bind names among the bits; split over lanes as the kernel
    splits them, the same bits."""
    mask, seq_len = _load(name), 48
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    first = batch_params(mask, name, seq_len, rng, 2)
    kw = {k: first.pop(k) for k in ("num_heads", "kv_len") if k in first}
    dm = mask.bind_on_device(seq_len, device="cpu", max_segments=6, **kw, **first)
    new = perturbed(data.draw, mask, first, seq_len)
    if new:
        dm.update(**new)
    got = _device_checks(mask, dm, 1)
    assert np.array_equal(_device_checks(mask, dm, 3), got)
    values = dm._table.host_values(dm.table.numpy().astype(np.int64))
    for b in range(dm.batch):
        one = {k: (v[b] if k not in ("seq_len", "kv_len", "num_heads") and dm.batch > 1 else v)
               for k, v in values.items()}
        try:
            mask.bind(**one)
            error = None
        except maskc.BindError as e:
            error = e
        assume(error is None or "requirement" in str(error) or "segments" in str(error) or "partition" in str(error)
               or "sum" in str(error) or "negative" in str(error))
        assert bool(got[b].any()) == (error is not None), (b, one, got[b], error)
        if error is not None and "requirement" in str(error):
            rule = next(i for i, r in enumerate(mask.resolved.requires) if r.span == error.span)
            assert got[b, 1] >> rule & 1, (one, got[b], error)


@needs_gxx
@given(left=q_expr(), op=st.sampled_from(["<", "<=", "==", "!=", ">=", ">"]), right=q_expr(), negate=st.booleans(),
       b=binding(max_len=40))
def test_emitted_checks_of_random_rules_agree_with_bind(left, op, right, negate, b):
    """A random `require` rule over q, the int parameters, segment attributes and per-segment values (products,
    floor division, bit operations, min/max), written by the predicate's CWriter and checked at bind's positions:
    the emitted check fails exactly where bind's interpreter rejects the values."""
    from mask_strategies import HEADER

    seq_len, _, params = b
    cond = f"{left} {op} {right}"
    text = f"{HEADER}\n  require {'not (' + cond + ')' if negate else cond}\n  allow k <= q\n"
    try:
        mask = maskc.compile_mask(text)
    except MaskError:
        assume(False)
    assume(unsupported(mask.ranges) is None)
    try:
        mask.const_values()
    except maskc.BindError:             # a rule of constants only that fails: every bind refuses the mask
        assume(False)
    caps = {"docs": len(params["docs"]), "sub": len(params["sub"])}
    try:
        mask.bind(seq_len=seq_len, **params)
        error = None
    except maskc.BindError as e:
        error = e
    assume(error is None or "requirement not met" in str(error))
    # the table of these values (the rule apart: the same layout), checked by the rule's emitted code
    dm = maskc.compile_mask(f"{HEADER}\n  allow k <= q\n").bind_on_device(seq_len, device="cpu", max_segments=caps,
                                                                      **params)
    got = _device_checks(mask, dm, 1)
    assert got[0, 0] == 0
    assert bool(got[0, 1]) == (error is not None), (text, params, error)


@pytest.mark.parametrize("name, values", [
    ("document", {"docs": [7] * 8}),
    ("document", {"docs": [30, 26]}),
    ("hstu", {"users": [30, 26], "targets": [2, 3], "context": 1}),
    ("shared_prompt", {"prompt": 6, "responses": [25, 25]}),
    ("sliding_window", {"window": 9}),
])
def test_an_update_is_one_copy_per_value(name, values):
    """What DeviceTable.write runs (the same code on the GPU, where the validate kernel follows: the update's
    only other launch): one copy into the stage per value given as a tensor of the right dtype and size, and one
    fill after the segments a segments parameter or per-segment array is given fewer than its capacity of."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket not in (torch.ops.aten.slice, torch.ops.aten.select, torch.ops.aten.expand,
                                           torch.ops.aten.view, torch.ops.aten.unsqueeze, torch.ops.aten.detach):
                self.ops.append(func.overloadpacket.__name__)     # views launch nothing
            return func(*args, **(kwargs or {}))

    mask = _load(name)
    dm = mask.bind_on_device(56, device="cpu", max_segments=8, **{k: v for k, v in values.items()})
    tensors = {k: torch.tensor(v) for k, v in values.items()}
    with Recorder() as rec:
        dm._table.write(tensors)
    short = sum(1 for k, v in values.items() if mask.resolved.param(k).kind in ("segments", "per") and len(v) < 8)
    assert sorted(rec.ops) == sorted(["copy_"] * len(values) + ["fill_"] * short), rec.ops


def test_cpu_attention_follows_the_values_of_each_update():
    mask = _load("document")
    dm = mask.bind_on_device(24, docs=[24], max_segments=4, device="cpu")
    q, k, v = (torch.randn(1, 2, 24, 8, dtype=torch.float64) for _ in range(3))
    for docs in ([24], [5, 19], [1, 2, 3, 18]):
        dm.update(docs=torch.tensor(docs))
        want = maskc.attention(q, k, v, mask.bind(seq_len=24, docs=docs))
        assert torch.allclose(maskc.attention(q, k, v, dm), want)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_takes_new_values_every_step_without_recompiling(backend):
    """A compiled step that writes new document lengths into a device mask (update: one custom op) and attends
    through it: one graph, no recompile, no graph break, each step's gradients those of a host bind of its
    lengths (the CPU path: the mask's dense form, read back after each update)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    mask = _load("document")
    dm = mask.bind_on_device(37, docs=[37], max_segments=5, device="cpu")

    def step(q, k, v, lengths):
        dm.update(docs=lengths)
        return (maskc.attention(q, k, v, dm) ** 2).sum()

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    q, k, v = (torch.randn(1, 2, 37, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for docs in ([10, 27], [37], [5, 5, 27], [20, 17], [1, 2, 3, 4, 27]):
        lengths = torch.tensor(docs + [0] * (5 - len(docs)))
        got = torch.autograd.grad(compiled(q, k, v, lengths), (q, k, v))
        want = torch.autograd.grad((maskc.attention(q, k, v, mask.bind(seq_len=37, docs=docs)) ** 2).sum(),
                                   (q, k, v))
        for a, b in zip(got, want):
            assert torch.allclose(a, b)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"] and not counters["graph_break"], (dict(counters["recompiles"]),
                                                                         dict(counters["graph_break"]))


# -- the one-pass view kernels' protocol, modelled ------------------------------------------------------------

@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=80), seed=st.integers(0, 10 ** 6),
       lanes=st.sampled_from([1, 2, 32]))
def test_lookback_gives_every_tile_its_prefix_in_any_interleaving(counts, seed, lanes):
    """maskc_lookback, tiles at random relative speeds and each lane reading at its own moment: every tile's
    prefix is the sum of the counts before it, and some tile can always move (lookback_prefixes asserts both;
    lanes 1 and 2 make many tiles look back over more than one window of predecessors)."""
    got = device_model.lookback_prefixes(counts, np.random.default_rng(seed), lanes)
    assert got == [sum(counts[:t]) for t in range(len(counts))]


@given(rows=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 9)), min_size=1, max_size=40),
       cap=st.integers(0, 60), seed=st.integers(0, 10 ** 6))
def test_one_pass_view_is_the_two_pass_view(rows, cap, seed):
    """The one-pass kernel (runs written at their look-back prefix where they fit, then the last CTA's rewrite past
    the capacity) leaves the arrays the two-pass kernels did (device_model.view: the host's rule), whatever runs
    the rows that end up past the kept prefix wrote first."""
    items = []
    for r, (count, lo) in enumerate(rows):   # a row's runs: distinct contents, and a hull exactly when it has runs
        runs = [(lo + 3 * i, lo + 3 * i + 2, FULL if i % 2 else PARTIAL) for i in range(count)]
        items.append((runs, 5 * count, (lo, lo + 3 * count) if count else (0, 0)))
    if cap < sum(1 for r, _, _ in items if r):
        assume(False)                            # DeviceMask._capacity leaves room for one run per row at least
    offsets, runs, kept = device_model.one_pass_view(items, cap, np.random.default_rng(seed))
    want_offsets, want_runs, _, want_kept = device_model.view(items, cap)
    assert kept == want_kept
    assert np.array_equal(offsets, want_offsets)
    assert np.array_equal(runs, want_runs.astype(np.int64))


@given(costs=st.lists(st.integers(0, (1 << 23) - 1) | st.integers(0, 6), min_size=1, max_size=256))
def test_rank_keys_give_the_hosts_order(costs):
    """maskc_rank_rows' 32-bit keys order rows as the host's lexsort((arange, -cost)) does (rank_order: heavier
    first, ties by index), small costs drawn often so that ties are common."""
    assert np.array_equal(device_model.rank_keys(costs), device_model.rank_order(costs))
