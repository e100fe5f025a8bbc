"""The token order's moves kernel on the CPU (templates/token_moves.cu.j2, maskc/codegen/moves.py,
maskc/runtime/moves.py): its index map compiled by g++ against TokenOrder.permutation and the torch moves; its
whole CTA body compiled by g++ and run block by block, thread by thread, on the arguments the runtime's plan makes
from torch arrays of many layouts (GQA, batches, strided views, LSE rows), bitwise against the torch moves;
every rendered variant through NVRTC for every target, without spills."""
from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc.analysis.order import TokenOrder
from maskc.codegen.moves import MoveSpec, emit_moves, moved_operand, token_map_source
from maskc.codegen.schedule import ARCHES
from maskc.ordered import token_order
from maskc.runtime.moves import Array, aligned, plan_moves

from conftest import EXAMPLES
from host_cxx import build_library, needs_gxx

torch = pytest.importorskip("torch")
from maskc.runtime.permute import _moved, from_order, to_order  # noqa: E402  (torch moves: the reference)

SHIM = """\
#define __host__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
struct alignas(16) uint4 { unsigned x, y, z, w; };
"""

MAP_LOOP = """
extern "C" void maskc_token_map(int origin, int width, int rows, int cols, int end, int seq_len, int* out) {
    const TokenMap m{origin, width, rows, cols, end};
    for (int i = 0; i < seq_len; ++i) out[i] = token_raster(m, i);
}
"""

def _compiled(source: str):
    return build_library(source, "the moves' code", ("-O1", "-Wall", "-Wno-unused-function"))


def host_map(order: TokenOrder, seq_len: int) -> np.ndarray:
    """token_raster (g++) at every place of ``seq_len`` tokens."""
    lib = _compiled(SHIM + token_map_source() + MAP_LOOP)
    out = np.full(seq_len, -1, np.int32)
    lib.maskc_token_map(order.origin, order.width, order.rows, order.cols, order.end(seq_len), seq_len,
                        out.ctypes.data_as(ctypes.POINTER(ctypes.c_int)))
    return out.astype(np.int64)


def ordered_of(order: TokenOrder, seq_len: int):
    """What the torch moves read of an OrderedMask: its order and its parent's length."""
    return SimpleNamespace(order=order, parent=SimpleNamespace(seq_len=seq_len))


# ---- the index map ------------------------------------------------------------------------------------------

@st.composite
def orders_and_lengths(draw):
    """Widths up to 200 (prime ones, NATTEN's 181), every divisor as patch width (1: bands column by column, the
    whole width: rows), origins anywhere (not multiples of 128), lengths with no band, some bands, a short last."""
    width = draw(st.one_of(st.sampled_from([181, 128, 61, 1]), st.integers(1, 200)))
    cols = draw(st.sampled_from([c for c in range(1, width + 1) if width % c == 0]))
    order = TokenOrder(draw(st.integers(0, 300)), width, draw(st.integers(1, 16)), cols)
    bands = draw(st.integers(0, 4))
    seq_len = max(1, order.origin + bands * order.band + draw(st.integers(-order.band, order.band)))
    return order, seq_len


@needs_gxx
@settings(max_examples=300, deadline=None)
@given(orders_and_lengths())
def test_the_map_is_the_permutation(case):
    order, seq_len = case
    got = host_map(order, seq_len)
    assert np.array_equal(got, order.permutation(seq_len))
    # the torch moves (a reshape and a transpose) take place i from raster position got[i] too
    moved = _moved(torch.arange(seq_len).view(1, 1, seq_len), ordered_of(order, seq_len), into=True)
    assert np.array_equal(moved.view(-1).numpy(), got)


# (example, bind parameters, seq_len, shapes): a text prefix not a multiple of 128 and a short last band, NATTEN's
# prime width column by column, the benchmark's CLEAR, frames of a video
MASKS = [
    ("clear", {"text": 64, "width": 64, "radius": 9}, 64 + 512 * 5 + 100, ("8x8", "4x16", "16x4", "8x1")),
    ("clear", {"text": 512, "width": 128, "radius": 16}, 32768, ("8x16", "4x32")),
    ("neighborhood", {"width": 181, "window": 13}, 181 * 181, ("8x1", "16x1")),
    ("video", {"width": 16, "height": 16, "radius": 3, "past": 1}, 16 * 16 * 10 + 40, ("8x8", "4x8")),
]


@needs_gxx
@pytest.mark.parametrize("name,params,seq_len,shapes", MASKS, ids=[f"{m[0]}-{m[2]}" for m in MASKS])
def test_the_map_is_the_ordered_masks_permutation(name, params, seq_len, shapes):
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=seq_len, **params)
    for shape in shapes:
        ordered = token_order(bound, shape)
        assert np.array_equal(host_map(ordered.order, seq_len), ordered.permutation), shape


# ---- the whole kernel on the host -------------------------------------------------------------------------

_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "const char*": ctypes.c_void_p,
           "char*": ctypes.c_void_p}


def host_kernel(spec: MoveSpec):
    """The kernel's CTA body (g++) and a loop that runs it for every block and thread of a grid."""
    loop = (f'\nextern "C" void maskc_moves_host({spec.signature}, int blocks) {{\n'
            "    for (int block = 0; block < blocks; ++block)\n"
            "        for (int thread = 0; thread < maskc_moves::THREADS; ++thread)\n"
            f"            maskc_moves_block({spec.arguments}, block, thread);\n}}\n")
    lib = _compiled(SHIM + emit_moves(spec).source + loop)
    lib.maskc_moves_host.argtypes = [_CTYPES[t] for t, _ in spec.params] + [ctypes.c_int]
    lib.maskc_moves_host.restype = None
    return lib.maskc_moves_host


def array_of(x) -> Array:
    item = x.element_size()
    return Array(tuple(x.shape), tuple(s * item for s in x.stride()), item, x.data_ptr())


def host_moves(xs, order: TokenOrder, seq_len: int, into: bool):
    """``xs`` moved by the kernel's body on the host, with the runtime's plan (its arguments, grid, shapes)."""
    arrays = [array_of(x) for x in xs]
    plan = plan_moves(arrays, order, seq_len, into)
    assert plan is not None and aligned(plan, [a.ptr for a in arrays])
    outs = [torch.full(shape, float("nan"), dtype=x.dtype) for shape, x in zip(plan.shapes, xs)]
    args = [int(a) for a in plan.args]
    for (src, dst), x, o in zip(plan.pointers, xs, outs):
        args[src], args[dst] = x.data_ptr(), o.data_ptr()
    host_kernel(plan.spec)(*args, plan.blocks)
    return outs


def bits(x):
    """``x``'s bytes as integers of its width: equal bits, NaNs too."""
    return x.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def layouts(B: int, Hq: int, Hkv: int, S: int, D: int, dtype, device: str = "cpu"):
    """q, k, v, out-like arrays and LSE rows of several layouts, on ``device``: contiguous, (B, S, H, D) storage
    transposed, heads sliced from a wider tensor, a batch and head stride of a padded buffer; GQA (Hkv < Hq)."""
    g = torch.Generator().manual_seed(B * 1000 + S)
    rand = lambda *shape, dtype=dtype: torch.randn(*shape, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    q = rand(B, Hq, S, D)
    k = rand(B, S, Hkv, D).transpose(1, 2)                      # the FA layout seen as (B, H, S, D)
    v = rand(B, Hkv + 3, S, D)[:, 1:Hkv + 1]                    # heads of a wider tensor
    o = rand(B, Hq, S + 5, D + 8)[:, :, 2:S + 2, :D]            # padded rows and head dim
    lse = rand(B, Hq, S, dtype=torch.float32)
    dlse = rand(B, S, Hq, dtype=torch.float32).transpose(1, 2)  # strided LSE rows
    return q, k, v, o, lse, dlse


CASES = [
    # (order, seq_len, B, Hq, Hkv, D, dtype)
    (TokenOrder(64, 64, 8, 8), 64 + 512 * 5 + 100, 2, 4, 2, 128, torch.bfloat16),
    (TokenOrder(7, 181, 8, 1), 7 + 181 * 17 + 30, 1, 2, 1, 64, torch.float16),
    (TokenOrder(512, 128, 8, 16), 512 + 1024 * 3, 1, 2, 2, 256, torch.bfloat16),
    (TokenOrder(0, 10, 3, 5), 10 * 9 + 4, 3, 3, 1, 8, torch.float32),
]


@needs_gxx
@pytest.mark.parametrize("into", [True, False], ids=["into", "back"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0].name}-w{c[0].width}-o{c[0].origin}-d{c[5]}" for c in CASES])
def test_the_kernel_body_moves_as_torch_does(case, into):
    """Every operand of a backward's launch at once (five of head-dim rows, two of LSE rows), then the forward's
    shapes: bitwise the torch moves, and x[:, :, permutation] (into) or x[:, :, inverse] (back)."""
    order, S, B, Hq, Hkv, D, dtype = case
    xs = layouts(B, Hq, Hkv, S, D, dtype)
    got = host_moves(xs, order, S, into)
    index = torch.from_numpy(order.permutation(S) if into else order.index(np.arange(S), S))
    for x, g in zip(xs, got):
        want = (to_order if into else from_order)(x, ordered_of(order, S))
        assert torch.equal(bits(g), bits(want))
        assert torch.equal(bits(g), bits(x.index_select(2, index)))
    out, lse = host_moves(xs[3:5], order, S, into)
    assert torch.equal(bits(out), bits(got[3])) and torch.equal(bits(lse), bits(got[4]))


@pytest.mark.parametrize("case", CASES[:2], ids=[f"{c[0].name}-w{c[0].width}" for c in CASES[:2]])
def test_the_plans_arguments_have_the_signatures_types(case):
    """The launch packs each argument as the kernel's parameter takes it (the host loop above converts them, the
    driver does not): int32 for int, int64 for long long, 64-bit addresses for pointers, in signature order."""
    order, S, B, Hq, Hkv, D, dtype = case
    plan = plan_moves([array_of(x) for x in layouts(B, Hq, Hkv, S, D, dtype)], order, S, True)
    sizes = {"int": np.int32, "long long": np.int64, "const char*": np.uint64, "char*": np.uint64}
    assert len(plan.args) == len(plan.spec.params)
    for arg, (ctype, name) in zip(plan.args, plan.spec.params):
        assert type(arg) is sizes[ctype], (name, type(arg))
    for j, (src, dst) in enumerate(plan.pointers):
        assert plan.spec.params[src][1] == f"x{j}_src" and plan.spec.params[dst][1] == f"x{j}_dst"


def test_plans_refuse_what_the_kernel_cannot_take():
    order = TokenOrder(0, 8, 2, 4)
    ok = Array((1, 2, 32, 64), (2 * 32 * 128, 32 * 128, 128, 2), 2, 0)
    assert plan_moves([ok], order, 32, True) is not None
    assert plan_moves([ok._replace(strides=(0, 0, 128, 4))], order, 32, True) is None          # last dim strided
    assert plan_moves([ok._replace(strides=(0, 4096, 120, 2))], order, 32, True) is None       # rows not whole units
    assert plan_moves([ok, ok._replace(shape=(2, 2, 32, 64))], order, 32, True) is None         # two batches
    assert plan_moves([ok._replace(shape=(1, 2, 31, 64))], order, 32, True) is None             # another length
    assert plan_moves([ok._replace(shape=(1, 0, 32, 64))], order, 32, True) is None             # empty
    assert plan_moves([Array((1, 2, 32, 3), (192, 96, 6, 2), 2, 0)], order, 32, True) is None   # 6-byte rows
    # 4-byte units where 16 do not divide the row (12-byte rows), 16 where they do; the pointer checked per call
    plan = plan_moves([Array((1, 2, 32, 6), (768, 384, 12, 2), 2, 0), ok], order, 32, True)
    assert [op.unit for op in plan.spec.operands] == [4, 16]
    assert aligned(plan, [4, 16]) and not aligned(plan, [4, 8])
    # a size-one axis's stride is never stepped along, whatever it is
    assert plan_moves([ok._replace(shape=(1, 1, 32, 64), strides=(6, 6, 128, 2))], order, 32, True) is not None


@pytest.mark.parametrize("row_bytes", [4, 12, 128, 192, 256, 512, 4096, 32000])
def test_every_operand_shape_covers_its_tile(row_bytes):
    op = moved_operand(row_bytes)
    assert op.row_bytes == row_bytes and row_bytes % op.unit == 0
    assert op.per_thread * 256 >= op.tile * op.units > (op.per_thread - 1) * 256
    assert moved_operand(6) is None and moved_operand(0) is None


# ---- NVRTC -----------------------------------------------------------------------------------------------

VARIANTS = [  # the runtime's launches: forward in (q, k, v), out (with LSE), backward in (5 + 2), gradients back
    (True, (256, 256, 256)), (False, (256, 4)), (False, (256,)), (True, (128,) * 5 + (4, 4)), (False, (512,) * 3)]


@pytest.mark.parametrize("arch", ARCHES)
def test_every_variant_compiles_through_nvrtc(arch):
    pytest.importorskip("cupy")
    from maskc.codegen.emit import compile_with_log

    for into, rows in VARIANTS:
        spec = MoveSpec(TokenOrder(512, 128, 8, 16), into, tuple(moved_operand(r) for r in rows), arch)
        source = emit_moves(spec)
        cubin, log = compile_with_log(source, ("--ptxas-options=-v",))
        assert spec.entry.encode() in cubin
        spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", log)
        assert spills and not any(int(n) for n in spills), log


def test_the_maps_divisions_are_compiled_away():
    """The order's numbers are constants: the PTX divides only per CTA (its slab and tile), never per row."""
    pytest.importorskip("cupy")
    from maskc.codegen.emit import compile_with_log

    spec = MoveSpec(TokenOrder(7, 181, 8, 1), True, (moved_operand(256), moved_operand(4)), "compute_90")
    ptx = compile_with_log(emit_moves(spec))[0].decode()
    divisions = sum(ptx.count(op) for op in ("div.s32", "div.u32", "rem.s32", "rem.u32", "div.s64", "rem.s64"))
    assert divisions == 2 * len(spec.operands), divisions
    assert "ld.global.nc.v4.u32" in ptx and "st.global.v4.u32" in ptx


def test_without_a_gpu_every_array_moves_by_torch():
    """to_order_all / from_order_all on CPU tensors: the torch moves one by one, None kept in its place."""
    from maskc.runtime.permute import from_order_all, to_order_all

    order, S = TokenOrder(5, 12, 3, 4), 5 + 36 * 4 + 7
    ordered = ordered_of(order, S)
    q, k, v, o, lse, dlse = layouts(2, 4, 2, S, 16, torch.bfloat16)
    moved = to_order_all((q, None, k, v, lse, None), ordered)
    assert moved[1] is None and moved[5] is None
    for x, m in zip((q, k, v, lse), (moved[0], moved[2], moved[3], moved[4])):
        assert torch.equal(bits(m), bits(to_order(x, ordered)))
    back = from_order_all((moved[0], o), ordered)
    assert torch.equal(bits(back[0]), bits(q)) and torch.equal(bits(back[1]), bits(from_order(o, ordered)))
