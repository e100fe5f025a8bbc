"""Kernels for every GPU: each example compiles through NVRTC for each target maskc builds for (no GPU
needed), with the engine the schedule picks there, and the schedule maps compute capabilities to targets."""
from __future__ import annotations

import glob
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

import maskc
from maskc.codegen.emit import compile_to_cubin, emit_backward_kernel, emit_kernel
from maskc.codegen.schedule import ARCHES, arch_for, capability_of

pytest.importorskip("cupy")
EXAMPLES = sorted(glob.glob(str(Path(__file__).resolve().parent.parent / "examples" / "*.mask")))
TARGETS = ARCHES + ("compute_80",)


def _build(job) -> tuple[str, str, str, int]:
    path, arch, backward = job
    mask = maskc.load(path)
    if backward:
        src = emit_backward_kernel(mask.backward_spec(head_dim=128, arch=arch))
    else:
        src = emit_kernel(mask.kernel_spec(head_dim=128, arch=arch))
    return Path(path).stem, arch, src.spec.engine, len(compile_to_cubin(src))


def _build_all(jobs):
    with ProcessPoolExecutor(2) as pool:   # NVRTC is the time: both of CI's cores
        return list(pool.map(_build, jobs))


def test_every_example_compiles_for_every_target():
    built = _build_all([(p, arch, False) for p in EXAMPLES for arch in TARGETS])
    assert len(built) == len(EXAMPLES) * len(TARGETS)
    for name, arch, engine, size in built:
        assert size > 0, (name, arch)
        assert engine == ("wgmma_tma" if arch == "sm_90a" else "mma"), (name, arch, engine)


def test_backward_compiles_for_every_target():
    hstu = next(p for p in EXAMPLES if p.endswith("hstu.mask"))   # the example with the most predicate code
    for name, arch, engine, size in _build_all([(hstu, arch, True) for arch in TARGETS]):
        assert size > 0 and engine == ("wgmma_tma" if arch == "sm_90a" else "mma"), (arch, engine)


def test_score_modifier_backward_compiles_for_every_target():
    """The examples with a score modifier: their backward (the gradient through mod') on every target (the
    forward is in test_every_example_compiles_for_every_target)."""
    paths = [p for p in EXAMPLES if Path(p).stem in ("alibi", "softcap")]
    assert len(paths) == 2
    for name, arch, engine, size in _build_all([(p, arch, True) for p in paths for arch in TARGETS]):
        assert size > 0 and engine == ("wgmma_tma" if arch == "sm_90a" else "mma"), (name, arch, engine)


@pytest.mark.slow
def test_every_example_backward_compiles_for_every_target():
    assert len(_build_all([(p, arch, True) for p in EXAMPLES for arch in TARGETS])) == len(EXAMPLES) * len(TARGETS)


@pytest.mark.parametrize("capability,arch", [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_86"),
                                             ((8, 9), "sm_89"), ((9, 0), "sm_90a"), ((10, 0), "sm_100a"),
                                             ((12, 0), "sm_120a"), ((10, 3), "compute_103"), ((12, 1), "compute_121")])
def test_capability_picks_the_target(capability, arch):
    assert arch_for(capability) == arch
    assert capability_of(arch)[0] == capability[0]


def test_old_gpus_and_hopper_engines_elsewhere_are_refused():
    with pytest.raises(ValueError, match="8.0"):
        arch_for((7, 5))
    with pytest.raises(ValueError, match="sm_90a"):
        emit_kernel(maskc.load(EXAMPLES[0]).kernel_spec(engine="wgmma_tma", arch="sm_100a",
                                                        block_m=128, block_n=128, num_warps=8))


def _build_bound(job) -> int:
    name, arch, backward = job
    mask = maskc.load(Path(EXAMPLES[0]).parent / f"{name}.mask")
    bound = mask.bind(4096, **({"users": [2048, 2048], "targets": [100, 200]} if name == "hstu" else {}))
    assert bound.narrow
    spec = bound.backward_spec(head_dim=128, arch=arch) if backward else bound.kernel_spec(head_dim=128, arch=arch)
    src = emit_backward_kernel(spec) if backward else emit_kernel(spec)
    assert "typedef int maskc_int;" in src.source
    return len(compile_to_cubin(src))


def test_the_32_bit_predicate_compiles():
    """Bindings within 32 bits get the int predicate (maskc.analysis.widths.fits_32_bits): it compiles on both
    forward engines and the backward."""
    jobs = [("clear", "sm_90a", False), ("clear", "sm_80", False), ("hstu", "sm_90a", False), ("hstu", "sm_90a", True)]
    with ProcessPoolExecutor(2) as pool:
        assert all(size > 0 for size in pool.map(_build_bound, jobs))
