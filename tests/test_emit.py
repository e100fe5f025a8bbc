"""The kernel template renders and compiles through NVRTC for sm_90a (no GPU needed)."""
from __future__ import annotations

import dataclasses
import re

import pytest

from maskc.codegen.emit import (KernelCompileError, compile_to_cubin, compile_with_log, emit_backward_kernel,
                                emit_kernel, nvrtc_options, template_dir)
from maskc.kernel_ir import Predicate, KernelSpec
from maskc.codegen.schedule import choose_tiles

import maskc
from maskc.codegen.emit import interval_regions
from maskc.options import Options
from conftest import EXAMPLES, EXAMPLE_NAMES

# Predicates from the real compiler: document (exact: interval path) and clear (per-key atoms).
PRED_DOCUMENT = maskc.load(EXAMPLES / "document.mask").kernel_spec().predicate
PRED_FULL = maskc.load(EXAMPLES / "clear.mask").kernel_spec(constants=(("text", 64), ("width", 32))).predicate

pytest.importorskip("cupy")


def spec(head_dim=128, dtype="bf16", predicate=PRED_DOCUMENT, name="document", tiles=None, engine="mma"):
    block_m, block_n, num_warps = tiles or choose_tiles(head_dim, dtype, engine=engine)[:3]
    return KernelSpec(mask_name=name, head_dim=head_dim, dtype=dtype, block_m=block_m, block_n=block_n,
                      num_warps=num_warps, predicate=predicate, mask_summary=("a test mask", "second line"),
                      engine=engine)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("predicate", [PRED_FULL, PRED_DOCUMENT], ids=["opaque", "exact"])
def test_compiles_for_sm90a(head_dim, dtype, predicate):
    src = emit_kernel(spec(head_dim, dtype, predicate))
    cubin = compile_to_cubin(src)
    assert cubin[:4] == b"\x7fELF"
    assert f'extern "C" __global__' in src.source and src.entry == "maskc_fwd_document"


@pytest.mark.parametrize("head_dim,dtype,predicate", [(128, "bf16", PRED_DOCUMENT), (128, "fp16", PRED_FULL),
                                                     (64, "bf16", PRED_FULL), (64, "fp16", PRED_DOCUMENT),
                                                     (256, "bf16", PRED_DOCUMENT), (256, "fp16", PRED_FULL)],
                         ids=["128-bf16-exact", "128-fp16-opaque", "64-bf16-opaque", "64-fp16-exact",
                              "256-bf16-exact", "256-fp16-opaque"])
def test_wgmma_kernel_compiles(head_dim, dtype, predicate):
    """The Hopper kernel assembles for sm_90a with wgmma of the right shapes, within the register file."""
    engine = "wgmma_tma"
    from maskc.runtime.cpu_check import cubin_registers_by_kernel

    src = emit_kernel(spec(head_dim, dtype, predicate, engine=engine))
    block_n = choose_tiles(head_dim, dtype, engine=engine).block_n
    assert src.plan.wgmma_widths == tuple(sorted({block_n, head_dim}))     # S = Q K^T, O += P V
    assert (src.plan.interval_regions is not None) == (predicate is PRED_DOCUMENT)
    cubin, log = compile_with_log(src, ("--ptxas-options=-v",))
    registers = cubin_registers_by_kernel(cubin)[src.entry]
    assert registers <= 65536 // src.plan.threads   # the entry's cap; then setmaxnreg moves them
    spilled = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    # D=64 runs three warpgroups at 160 registers, D=256 two at 240 with 128 for O alone (plan.tma_registers):
    # there ptxas spills a little
    budget = {64: 32, 128: 0, 256: 80}[head_dim]
    assert spilled <= budget, f"{spilled} bytes of spills"
    assert "C7514" not in log and "serialized" not in log, "ptxas serialized the wgmma pipeline"


@pytest.mark.parametrize("switch", ["pingpong", "overlap"])
def test_wgmma_tma_variants_compile(switch):
    """The switches of the warp-specialized kernel (Options; bench/NOTES.md) reach its plan, change the
    kernel, and render kernels ptxas takes as they are."""
    default = emit_kernel(spec(128, "bf16", PRED_DOCUMENT, engine="wgmma_tma"))
    src = emit_kernel(spec(128, "bf16", PRED_DOCUMENT, engine="wgmma_tma"), Options(**{switch: False}))
    assert getattr(default.plan, switch) and not getattr(src.plan, switch)
    assert src.source != default.source
    _, log = compile_with_log(src, ("--ptxas-options=-v",))
    assert "C7514" not in log and " 0 bytes spill stores" in log


@pytest.mark.parametrize("tiles", [(128, 128, 4), (64, 128, 8), (128, 136, 8)])
def test_wgmma_tma_rejects_shapes_it_cannot_run(tiles):
    with pytest.raises(ValueError, match="wgmma_tma"):
        emit_kernel(spec(tiles=tiles, engine="wgmma_tma"))
    with pytest.raises(ValueError, match="shared memory"):
        emit_kernel(spec(head_dim=256, engine="wgmma_tma", tiles=(128, 128, 8)))


def test_backward_wgmma_layout_and_tiles():
    """The wgmma dK/dV kernel reads every tile at the 1024-byte swizzle atom, with slack to align the base;
    it takes only its 64 x 128 tiles."""
    from maskc.codegen.emit import check_backward_spec
    from maskc.codegen.plan import backward_layout

    spec = dataclasses.replace(maskc.load(EXAMPLES / "causal.mask").backward_spec(head_dim=64), engine="wgmma",
                               dq_reduction="red2")
    layout = backward_layout(spec)["dkdv"]
    assert all(layout[name] % 1024 == 0 for name in ("k", "v", "q", "do", "ds"))
    assert layout["total"] - 1024 >= layout["bits"] + 64 * 4 * 4
    mma = backward_layout(dataclasses.replace(spec, engine="mma"))["dkdv"]
    assert mma["total"] < layout["total"]
    # bulk_tile stages each warp's 16 rows x D / 2 fp32 dQ tile, after everything else
    tiled = backward_layout(dataclasses.replace(spec, dq_reduction="bulk_tile"))["dkdv"]
    assert tiled["dq_stage"] >= layout["bits"] and tiled["total"] - tiled["dq_stage"] >= 8 * 16 * 32 * 4
    with pytest.raises(ValueError, match="64 queries x 128 keys"):
        check_backward_spec(dataclasses.replace(spec, block_n=64))
    with pytest.raises(ValueError, match="unknown"):
        check_backward_spec(dataclasses.replace(spec, engine="wgmma_v2"))
    with pytest.raises(ValueError, match="mma red2"):
        check_backward_spec(dataclasses.replace(spec, engine="mma", dq_reduction="bulk_tile"))
    with pytest.raises(ValueError, match="wgmma_tma bulk_tile"):
        check_backward_spec(dataclasses.replace(spec, engine="wgmma_tma", dq_reduction="red2"))
    with pytest.raises(ValueError, match="dQ reduction 'none'"):      # retired: it left dQ out (timing only)
        check_backward_spec(dataclasses.replace(spec, dq_reduction="none"))


def test_backward_warp_specialized_layout_and_registers():
    """The warp-specialized dK/dV kernel double-buffers dS^T and the bits, keeps its mbarriers after the
    staging, launches a producer warpgroup more, and assembles within the register split it asks for (168
    per thread at launch: 24 for the producer, 240 for the consumers after setmaxnreg)."""
    from maskc.codegen.plan import backward_layout, dkdv_threads
    from maskc.runtime.cpu_check import cubin_registers_by_kernel

    mask = maskc.load(EXAMPLES / "causal.mask")
    tma = mask.backward_spec(head_dim=128, engine="wgmma_tma")
    wgmma = dataclasses.replace(tma, engine="wgmma")
    one, two = backward_layout(wgmma)["dkdv"], backward_layout(tma)["dkdv"]
    assert two["lse"] - two["ds"] == 2 * (one["lse"] - one["ds"])        # dS^T x 2
    assert all(two[name] % 1024 == 0 for name in ("k", "v", "q", "do", "ds", "dq_stage"))
    assert two["bars"] > two["dq_stage"] and two["total"] <= 227 * 1024
    assert dkdv_threads(tma) == dkdv_threads(wgmma) + 128 == 384
    src = emit_backward_kernel(tma)
    cubin, log = compile_with_log(src, ("--ptxas-options=-v",))
    registers = cubin_registers_by_kernel(cubin)
    assert registers[tma.entry_dkdv] <= 65536 // 384 and registers[tma.entry_dkdv_det] <= 65536 // 384
    assert registers[tma.entry_dkdv_ordered] <= 65536 // 384     # the deterministic mode's: dQ added in turns
    assert tma.entry_dkdv_ordered not in wgmma.entries
    assert "C7514" not in log and "serialized" not in log, "ptxas serialized the wgmma pipeline"


def test_source_reads_as_cuda():
    src = emit_kernel(spec())
    for leftover in ("{{", "}}", "{%", "%}", "{#", "#}"):
        assert leftover not in src.source, leftover
    assert PRED_DOCUMENT.source in src.source   # the predicate is placed verbatim
    assert "//   a test mask" in src.source and "//   second line" in src.source
    assert "--gpu-architecture=sm_90a" in src.options and "--std=c++17" in src.options
    assert any(o.startswith("-I") for o in nvrtc_options())
    assert (template_dir() / "attention_fwd.cu.j2").is_file()


@pytest.mark.parametrize("bad", ["doc-mask", "1causal", "causal mask", "", "a;b", "ü"])
def test_mask_name_must_be_c_identifier(bad):
    with pytest.raises(ValueError, match="C identifier"):
        emit_kernel(spec(name=bad))


def test_unsupported_shapes_are_rejected():
    with pytest.raises(ValueError):
        choose_tiles(96, "bf16")
    with pytest.raises(ValueError):
        choose_tiles(128, "fp32")
    with pytest.raises(ValueError):
        emit_kernel(spec(tiles=(128, 64, 2)))   # 64 rows per warp


def test_compile_error_carries_the_log():
    from maskc.codegen.emit import KernelCompileError

    with pytest.raises(KernelCompileError, match=r"(?s)NVRTC failed.*error"):
        compile_to_cubin(emit_kernel(spec(predicate=Predicate("struct MaskRow { int q; }; this is not C++;", 1, 0,
                                                              intervals_only=False))))


def test_emit_is_pure():
    a, b = emit_kernel(spec()), emit_kernel(spec())
    assert a.source == b.source and a.options == b.options
    assert not re.search(r"\bnan\b", a.source)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_interval_path_for_exact_masks(name):
    """Every example linear in k gets the per-CTA interval table; those with per-key atoms (clear,
    neighborhood, video, morton_local, tree_verify, sliding_tile) evaluate their predicate per pair."""
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    constants = tuple((n, 16) for n in mask.const_params)      # clear compiles text and width in
    sp = mask.kernel_spec(head_dim=128, dtype="bf16", constants=constants, engine="mma")
    iv = interval_regions(sp)
    assert (iv is None) == (not mask.ranges.linear)
    assert mask.ranges.linear == (name not in ("clear", "neighborhood", "video", "morton_local", "tree_verify",
                                               "sliding_tile"))
    plan = emit_kernel(sp).plan
    assert plan.interval_regions == (None if iv is None else (iv["allow"], iv["deny"]))


def test_interval_path_compiles():
    sp = maskc.load(EXAMPLES / "hstu.mask").kernel_spec(head_dim=64, dtype="fp16")
    assert compile_to_cubin(emit_kernel(sp))[:4] == b"\x7fELF"


@pytest.mark.parametrize("order", [None, "8x16"])
def test_root_tables_reach_the_kernels(order):
    """CLEAR's chunk nests read their disc roots from tables: the forward plan gives each consumer warp one
    (counted in its shared memory) and fills it per work item; the backward's layouts hold one per CTA, filled
    by every kernel that masks through mask_bits. A mask whose nests have no roots (neighborhood) gets none."""
    from maskc.codegen.plan import backward_layout
    from maskc.codegen.plan import shared_bytes
    from maskc.codegen.tile_bits import ROOT_ENTRIES
    from maskc.ordered import in_order

    mask = maskc.load(EXAMPLES / "clear.mask")
    constants = mask.const_values({})
    if order:
        mask = in_order(mask, order, constants)
    bits = Options(partial_tiles="bits")      # the stored path reads no roots: its builder computes them, once
    fwd = mask.kernel_source(bits, head_dim=128, dtype="bf16", constants=constants, engine="wgmma_tma")
    assert fwd.spec.predicate.root_tables == fwd.plan.root_tables == 1
    assert fwd.plan.shared_bytes == shared_bytes(fwd.spec, None) + 8 * ROOT_ENTRIES * 4
    assert "mask_root_entry(mask, it.mb," in fwd.source and "word, roots);" in fwd.source
    for engine in ("wgmma_tma", "wgmma", "mma"):
        bwd = mask.backward_source(bits, head_dim=128, dtype="bf16", constants=constants, engine=engine)
        layout = backward_layout(bwd.spec)
        assert layout["dkdv"]["roots"] >= layout["dkdv"]["bits"] and "roots" in layout["dq"]
        assert bwd.source.count("fill_root_tables(smem + ") == 2        # dK/dV and dQ
    plain = maskc.load(EXAMPLES / "neighborhood.mask")
    src = plain.kernel_source(Options(), head_dim=128, dtype="bf16", constants=plain.const_values({}),
                              engine="wgmma_tma")
    assert src.spec.predicate.tile_bits and src.plan.root_tables == 0 and "MASK_ROOT_TABLES" not in src.source


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_setmaxnreg_splits_fit_the_registers_held_from_launch(head_dim):
    """setmaxnreg only moves registers between a CTA's warpgroups: an increase past what the others' decreases free
    waits for ever, a hang (session 22: 32 / 240 at 384 threads asks 65536 registers of the 64512 held). Oracle:
    ptxas's registers per thread for each warp-specialized kernel (what the CTA holds from launch) times its
    threads, against the split the plan asks for."""
    from maskc.runtime.cpu_check import cubin_registers_by_kernel

    mask = maskc.load(EXAMPLES / "causal.mask")
    fwd = mask.kernel_source(Options(engine="wgmma_tma"), head_dim=head_dim)
    held = cubin_registers_by_kernel(compile_to_cubin(fwd))[fwd.entry] * fwd.spec.threads
    producer, consumer = fwd.plan.registers
    assert 128 * producer + (fwd.spec.threads - 128) * consumer <= held
    bwd = mask.backward_source(engine="wgmma_tma", head_dim=head_dim)
    spec = bwd.spec
    registers = cubin_registers_by_kernel(compile_to_cubin(bwd))
    producer, consumer = bwd.plan.registers
    threads = bwd.plan.dkdv_threads
    kernels = [e for e in (spec.entry_dkdv, spec.entry_dkdv_det, spec.entry_dkdv_ordered) if e in registers]
    assert spec.entry_dkdv in kernels
    for entry in kernels:
        assert 128 * producer + (threads - 128) * consumer <= registers[entry] * threads, entry


def test_a_setmaxnreg_split_past_the_launch_registers_does_not_compile(monkeypatch):
    """The guard of the test above in the kernels themselves: a split that would hang is a compile error."""
    from maskc.codegen import plan

    monkeypatch.setattr(plan, "dkdv_registers", lambda spec: (32, 240))
    src = maskc.load(EXAMPLES / "causal.mask").backward_source(engine="wgmma_tma", head_dim=128)
    with pytest.raises(KernelCompileError, match="setmaxnreg's split"):
        compile_to_cubin(src)


@pytest.mark.parametrize("engine,head_dim", [("mma", 128), ("wgmma", 128), ("wgmma_tma", 64), ("wgmma_tma", 256)])
def test_backward_plan_gives_every_entry_its_shared_memory(engine, head_dim):
    """The loader launches each entry of a backward source with the plan's shared memory: every entry has one, the
    dK/dV modes the dK/dV layout's total, the dQ kernel the dQ layout's, the others none; and the block size
    the runtime launches is the plan's (a warp per 16 keys, plus the producer warpgroup on wgmma_tma)."""
    from maskc.codegen.plan import backward_layout

    bwd = maskc.load(EXAMPLES / "document.mask").backward_source(engine=engine, head_dim=head_dim)
    spec, plan = bwd.spec, bwd.plan
    layout = backward_layout(spec)
    assert set(spec.entries) <= set(plan.shared_bytes)
    for entry in spec.entries:
        dkdv = entry in (spec.entry_dkdv, spec.entry_dkdv_det, spec.entry_dkdv_ordered)
        expected = layout["dkdv"]["total"] if dkdv else layout["dq"]["total"] if entry == spec.entry_dq else 0
        assert plan.shared_bytes[entry] == expected, entry
    consumers = 256 if spec.split_head_dim else spec.block_n // 16 * 32
    assert plan.dkdv_threads == consumers + (128 if engine == "wgmma_tma" else 0)
    assert (plan.registers is not None) == (engine == "wgmma_tma")
