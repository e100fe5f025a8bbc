"""Golden kernels: the CUDA rendered for every example mask on every engine, compared exactly with the files
under tests/golden. A template or emitter change shows up here as a diff to review, kernel by kernel.

After an intended change, rewrite them and read the diff before committing it::

    python -m pytest tests/test_golden.py --update-golden
    git diff tests/golden

Whether a change that moves them changed the compiled code (a refactor of the templates, checked without a GPU):
``bench/golden_ptx.py --save`` before it and ``--compare`` after it.

Forward kernels: mma at head dim 128, wgmma_tma at each of its head dims (64, 128, 256); backward kernels:
the mma, wgmma and wgmma_tma dK/dV engines at head dim 128; all bf16, for sm_90a, with the product's default options,
const parameters at the file's defaults; and the element path's forward and backward
(``Options(partial_tiles="elements")``, wgmma_tma at 128) of the examples with a tile path. The masks are loaded
by absolute path: a kernel must not depend on where its .mask file lies.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import maskc
from conftest import EXAMPLE_NAMES, EXAMPLES

GOLDEN = Path(__file__).resolve().parent / "golden"
# (direction, engine, head dim)
KERNELS = (("fwd", "mma", 128), ("fwd", "wgmma_tma", 64), ("fwd", "wgmma_tma", 128), ("fwd", "wgmma_tma", 256),
           ("bwd", "mma", 128), ("bwd", "wgmma", 128), ("bwd", "wgmma_tma", 128))
# The element path of PARTIAL tiles (Options.partial_tiles="elements") for the examples that have a tile path
ELEMENTS = ("clear", "neighborhood", "video", "sliding_tile")
# The backward at head dim 256 (its warpgroups split the head dim): a mask of each kind of PARTIAL tile
SPLIT_HEAD_DIM = ("causal", "document", "clear", "softcap", "alibi")
CASES = ([(name, *kernel, "auto") for name in EXAMPLE_NAMES for kernel in KERNELS]
         + [(name, direction, "wgmma_tma", 128, "elements") for name in ELEMENTS for direction in ("fwd", "bwd")]
         + [(name, "bwd", "wgmma_tma", 256, "auto") for name in SPLIT_HEAD_DIM])


def golden_path(name: str, direction: str, engine: str, head_dim: int, partial: str = "auto") -> Path:
    return GOLDEN / name / f"{direction}_{engine}_d{head_dim}{'' if partial == 'auto' else '_' + partial}.cu"


def render(name: str, direction: str, engine: str, head_dim: int, partial: str = "auto") -> str:
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    if direction == "fwd":
        src = mask.kernel_source(maskc.Options(partial_tiles=partial), head_dim=head_dim, dtype="bf16", engine=engine)
        assert partial == "auto" or src.plan.partial_tiles == partial
        return src.source
    src = mask.backward_source(maskc.Options(partial_tiles=partial), head_dim=head_dim, dtype="bf16", engine=engine)
    assert partial == "auto" or src.spec.partial_tiles == partial
    return src.source


@pytest.mark.parametrize("name,direction,engine,head_dim,partial", CASES,
                         ids=[f"{n}-{d}-{e}-d{h}" + ("" if p == "auto" else f"-{p}") for n, d, e, h, p in CASES])
def test_kernel_matches_golden(name, direction, engine, head_dim, partial, request):
    source = render(name, direction, engine, head_dim, partial)
    path = golden_path(name, direction, engine, head_dim, partial)
    if request.config.getoption("--update-golden"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
        return
    assert path.is_file(), f"{path} missing: run `python -m pytest tests/test_golden.py --update-golden`"
    expected = path.read_text(encoding="utf-8")
    if source != expected:
        old, new = expected.splitlines(), source.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        pytest.fail(f"{path.relative_to(GOLDEN.parent)} differs from the rendered kernel from line {line + 1}:\n"
                    f"  golden:   {old[line] if line < len(old) else '(end of file)'}\n"
                    f"  rendered: {new[line] if line < len(new) else '(end of file)'}\n"
                    "If the change is intended: python -m pytest tests/test_golden.py --update-golden, "
                    "then review `git diff tests/golden`.")


def test_no_stale_golden_files(request):
    """Every file under tests/golden is one of the cases (a renamed example or engine leaves none behind)."""
    expected = {golden_path(*case) for case in CASES}
    found = set(GOLDEN.rglob("*.cu"))
    if request.config.getoption("--update-golden"):
        for stale in found - expected:
            stale.unlink()
        for folder in GOLDEN.iterdir():
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        return
    assert found - expected == set(), "stale golden files: run with --update-golden"
