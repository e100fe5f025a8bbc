"""The schedule's choices (maskc/codegen/schedule.py) per head dim, dtype, GPU generation and interval-table size,
held against what the kernels can take: every choice must pass the emitter's checks and fit its plan's
shared memory, and the choices that depend on the GPU or the table must change where they should."""
from __future__ import annotations

import dataclasses

import pytest

import maskc
from maskc.codegen.emit import check_backward_spec, check_spec
from maskc.kernel_ir import BACKWARD_ENGINES, ENGINES
from maskc.codegen.plan import SMEM_LIMIT, plan_forward, shared_bytes
from maskc.codegen.schedule import (ARCHES, DEFAULT_DQ_REDUCTION, DEFAULT_HOPPER_BACKWARD_ENGINE, DEFAULT_HOPPER_ENGINE,
                            HOPPER, PTX_CAPABILITIES, SUPPORTED_DTYPES, Tiles, arch_for, capability_of, check_target,
                            choose_backward_tiles, choose_dq_reduction, choose_tiles, forward_candidates)
from conftest import EXAMPLE_NAMES, EXAMPLES

CAPABILITIES = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
HEAD_DIMS = (64, 128, 256)
MASKS = {name: maskc.load(EXAMPLES / f"{name}.mask") for name in EXAMPLE_NAMES}


def forward_spec(mask, tiles: Tiles, head_dim: int, dtype: str, capability):
    return mask.kernel_spec(head_dim=head_dim, dtype=dtype, block_m=tiles.block_m, block_n=tiles.block_n,
                            num_warps=tiles.num_warps, engine=tiles.engine, arch=arch_for(capability))


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_every_forward_choice_is_a_kernel_that_fits(name, head_dim, capability):
    """For every example (its interval table), head dim and GPU: the schedule's tiles pass the emitter's
    checks and the plan's shared memory fits; wgmma_tma exactly where it applies (Hopper)."""
    mask = MASKS[name]
    for dtype in SUPPORTED_DTYPES:
        tiles = choose_tiles(head_dim, dtype, capability, table_regions=mask.table_regions)
        assert tiles.engine == (DEFAULT_HOPPER_ENGINE if capability == HOPPER else "mma")
        spec = forward_spec(mask, tiles, head_dim, dtype, capability)
        check_spec(spec)
        assert plan_forward(spec).shared_bytes <= SMEM_LIMIT


@pytest.mark.parametrize("regions", range(0, 9))
def test_head_dim_256_takes_fewer_keys_where_the_table_would_not_fit(regions):
    """wgmma_tma at D=256 keeps 80 keys per step while the interval table fits beside its tiles, 64 where
    it would not: the choice is the largest that fits (the plan's shared memory says so)."""
    tiles = choose_tiles(256, "bf16", table_regions=regions)
    spec = MASKS["causal"].kernel_spec(head_dim=256, block_m=tiles.block_m, block_n=tiles.block_n,
                                       num_warps=tiles.num_warps, engine=tiles.engine)
    table = (regions, 0) if regions else None
    assert shared_bytes(spec, table) <= SMEM_LIMIT
    wider = dataclasses.replace(spec, block_n=80)
    assert (tiles.block_n == 80) == (shared_bytes(wider, table) <= SMEM_LIMIT)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_forward_candidates_start_with_mma_and_are_all_kernels(head_dim):
    """The autotuner's candidates: the mma.sync kernel first (the reference the others are checked against),
    then on Hopper the warp-specialized ones; each one a kernel the emitter takes."""
    for capability in CAPABILITIES:
        candidates = forward_candidates(head_dim, "bf16", capability)
        assert candidates[0].engine == "mma" and len(set(candidates)) == len(candidates)
        assert {c.engine for c in candidates} == ({"mma", "wgmma_tma"} if capability == HOPPER else {"mma"})
        for c in candidates:
            check_spec(forward_spec(MASKS["document"], c, head_dim, "bf16", capability))


def test_engine_choice_and_refusals():
    for engine in ENGINES:
        assert choose_tiles(128, "bf16", engine=engine).engine == engine
    with pytest.raises(ValueError, match="not a forward engine .a dK/dV engine"):
        choose_tiles(128, "bf16", engine="wgmma")     # the forward's retired: wgmma_tma superseded it
    with pytest.raises(ValueError, match="not a forward engine; the forward's: mma, wgmma_tma"):
        choose_tiles(128, "bf16", engine="tensor")
    with pytest.raises(ValueError, match="compute capability 9.0"):
        choose_tiles(128, "bf16", capability=(8, 9), engine="wgmma_tma")
    for head_dim, dtype in ((96, "bf16"), (128, "fp32")):
        with pytest.raises(ValueError, match="unsupported"):
            choose_tiles(head_dim, dtype)


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_backward_choice_is_a_kernel(head_dim, capability):
    """The backward's tiles and engine pass the emitter's checks on every GPU, wgmma on Hopper only."""
    tiles = choose_backward_tiles(head_dim, "bf16", capability)
    assert tiles.engine == (DEFAULT_HOPPER_BACKWARD_ENGINE if capability == HOPPER else "mma")
    for engine in BACKWARD_ENGINES if capability == HOPPER else ("mma",):
        spec = MASKS["hstu"].backward_spec(head_dim=head_dim, engine=engine, arch=arch_for(capability))
        check_backward_spec(spec)
        assert spec.dq_reduction == choose_dq_reduction(engine)


def test_backward_refusals():
    for engine in ("wgmma", "wgmma_tma"):
        with pytest.raises(ValueError, match="compute capability 9.0"):
            choose_backward_tiles(128, "bf16", capability=(8, 9), engine=engine)
    with pytest.raises(ValueError, match="unknown"):
        choose_backward_tiles(128, "bf16", engine="wgmma_tma_v2")
    for capability, engine in (((8, 9), None), ((9, 0), "mma"), ((9, 0), "wgmma")):   # D=256: wgmma_tma's alone
        with pytest.raises(ValueError, match="head dim 256"):
            choose_backward_tiles(256, "bf16", capability=capability, engine=engine)
    with pytest.raises(ValueError, match="head dim 96"):
        choose_backward_tiles(96, "bf16")


def test_head_dim_256_backward_splits_the_head_dim():
    """At D=256 the warpgroups share 64 keys (dK and dV for 64 keys x 256 columns do not fit one warpgroup), add
    dQ themselves (no room for staging tiles) and so have no in-turns variant; the layout fits one CTA."""
    from maskc.codegen.plan import backward_layout, dkdv_threads
    from maskc.codegen.plan import SMEM_LIMIT
    tiles = choose_backward_tiles(256, "bf16")
    assert (tiles.block_m, tiles.block_n, tiles.engine) == (64, 64, "wgmma_tma")
    spec = MASKS["causal"].backward_spec(head_dim=256)
    assert spec.split_head_dim and spec.dq_reduction == "red2" and not spec.dq_in_turns
    assert spec.entry_dkdv_ordered not in spec.entries and dkdv_threads(spec) == 384
    layout = backward_layout(spec)["dkdv"]
    assert layout["total"] <= SMEM_LIMIT and layout["pt"] - layout["ds"] == 2 * 64 * 64 * 2   # two stages each
    for name in ("k", "v", "q", "do", "ds", "pt"):                                              # wgmma's atoms
        assert layout[name] % 1024 == 0
    assert not MASKS["causal"].backward_spec(head_dim=128).split_head_dim


def test_dq_reduction_choice():
    assert choose_dq_reduction("wgmma") == DEFAULT_DQ_REDUCTION
    assert choose_dq_reduction("wgmma", "red2") == "red2"
    assert choose_dq_reduction("mma") == choose_dq_reduction("mma", "bulk_tile") == "red2"   # its only one
    assert choose_dq_reduction("wgmma_tma") == choose_dq_reduction("wgmma_tma", "red2") == "bulk_tile"   # its only one
    assert choose_dq_reduction("wgmma_tma", "bulk_tile", head_dim=256) == "red2"   # no room to stage tiles
    for retired in ("none", "atomics"):
        with pytest.raises(ValueError, match="unknown"):
            choose_dq_reduction("wgmma", retired)
    spec = MASKS["causal"].backward_spec(head_dim=128, engine="wgmma", dq_reduction="red2")
    assert spec.dq_reduction == "red2"


@pytest.mark.parametrize("major", range(8, 13))
@pytest.mark.parametrize("minor", range(0, 10))
def test_the_target_of_a_gpu_runs_on_it(major, minor):
    """A GPU runs machine code of its own major version and a minor at most its own, an "a" target only on
    its own GPU, and PTX (compute_XY) anywhere newer: arch_for picks the newest of ARCHES it runs, else PTX
    for exactly this GPU."""
    target = arch_for((major, minor))
    runs = [a for a in ARCHES if capability_of(a)[0] == major and (
        capability_of(a) == (major, minor) if a.endswith("a") else capability_of(a)[1] <= minor)]
    assert target == (runs[-1] if runs else f"compute_{major}{minor}")
    assert capability_of(target)[0] == major and capability_of(target)[1] <= minor


def test_capability_of_reads_every_target_and_refuses_others():
    for arch in ARCHES:
        major, minor = capability_of(arch)
        assert arch in (f"sm_{major}{minor}", f"sm_{major}{minor}a") and arch_for((major, minor)) == arch
    assert capability_of("compute_80") == (8, 0)
    for bad in ("sm90", "hopper", "sm_9", "compute_90a_x", ""):
        with pytest.raises(ValueError, match="sm_XY"):
            capability_of(bad)


@pytest.mark.parametrize("major", range(8, 13))
@pytest.mark.parametrize("minor", range(0, 10))
def test_a_user_may_name_every_target_arch_for_picks(major, minor):
    """check_target (what Options.arch takes) takes whatever arch_for builds for on a GPU NVRTC knows, and PTX for
    it, but no target NVRTC would refuse: sm_XY[a] outside ARCHES, compute_XY outside PTX_CAPABILITIES (compute_99
    passed and failed only inside NVRTC), each refused with the targets listed."""
    target = arch_for((major, minor))
    if (major, minor) in PTX_CAPABILITIES:
        assert check_target(target) == capability_of(target)
        assert check_target(f"compute_{major}{minor}") == (major, minor)
    else:
        with pytest.raises(ValueError, match=f"^target 'compute_{major}{minor}' unsupported: .*compute_80, "):
            check_target(f"compute_{major}{minor}")
    for sm in (f"sm_{major}{minor}", f"sm_{major}{minor}a"):
        if sm not in ARCHES:
            with pytest.raises(ValueError, match=f"^target '{sm}' unsupported: maskc builds for {', '.join(ARCHES)},"):
                check_target(sm)


def test_ptx_targets_are_those_nvrtc_builds():
    """PTX_CAPABILITIES is NVRTC 13.0's list (8.0 and newer): the NVRTC at hand builds PTX for each of them."""
    pytest.importorskip("cupy")
    from cupy.cuda import nvrtc
    supported = {divmod(a, 10) for a in nvrtc.getSupportedArchs()}
    assert set(PTX_CAPABILITIES) == {c for c in supported if c >= (8, 0)}
