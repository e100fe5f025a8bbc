"""What ptxas made of the Hopper forward, read from its machine code without a GPU (maskc's NVRTC build, then
nvdisasm from the ``nvidia-cuda-nvdisasm`` wheel of the test extra; bench/sass_census.py does the reading).

The overlapped pipeline computes tile j + 1's softmax while the tensor cores finish tile j's P V, and only then
waits for that product. A wait has no operands, and ptxas used to schedule it before the softmax, which is
registers alone, losing the overlap; ``softmax_before_wait`` pins the order (bench/NOTES.md, session 16: causal
3.5% fewer cycles). Without it the steady loop's wait is followed by the tile's exponentials, and this fails."""
import sys

import pytest

from conftest import ROOT

pytest.importorskip("cupy", reason="NVRTC through CuPy (pip install -e '.[cuda]')")
sys.path.insert(0, str(ROOT / "bench"))
import sass_census as census  # noqa: E402

import maskc  # noqa: E402

if census.tool("nvdisasm") is None:
    pytest.skip("no nvdisasm (pip install -e '.[test]' brings it)", allow_module_level=True)

OPTIONS = maskc.Options().replace(arch="sm_90a", engine="wgmma_tma")


def forward_source(name: str, head_dim: int, **params):
    """The wgmma_tma forward of an example, or of a binding of it (``params``: a softcap's fixed maximum)."""
    from maskc.codegen.emit import emit_kernel

    mask = maskc.load(ROOT / "examples" / f"{name}.mask")
    if not params:
        return mask.kernel_source(OPTIONS, head_dim=head_dim)
    bound = mask.bind(seq_len=4096, **params)
    return emit_kernel(bound.kernel_spec(head_dim=head_dim, engine="wgmma_tma", arch="sm_90a"), OPTIONS)


@pytest.mark.parametrize("name,head_dim,params", [
    ("causal", 64, {}), ("causal", 128, {}), ("causal", 256, {}),
    ("hstu", 128, {}),                  # an interval table of twelve regions
    ("clear", 128, {}),                 # the stored path's PARTIAL tiles
    ("alibi", 128, {}),                 # a score modifier with a per-row term
    ("softcap", 128, {"cap": 50}),      # softcap's fixed maximum (a softmax without row maxima)
], ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(f"{k}={x}" for k, x in v.items()) or "-")
def test_softmax_runs_before_the_wait_for_pv(tmp_path, name, head_dim, params):
    src = forward_source(name, head_dim, **params)
    assert src.plan.overlap and (src.plan.fixed_max == bool(params))
    sass, _ = census.build(src, tmp_path / name, "nvrtc")
    waits = census.exponentials_after_waits(census.by_entry(sass)[src.entry])
    # The first tile's S is waited for alone and its softmax follows; every later wait for all products (the
    # steady loop's P V, the last tile's) must find the exponentials of its tile already done.
    assert len(waits) >= 2 and waits[0] > 0, waits
    assert waits[1:] == [0] * (len(waits) - 1), f"exponentials after the waits for P V: {waits}"
    # The lazy rescale (ForwardPlan.lazy_rescale: masks without a score modifier) votes per tile whether a row of
    # the warp moved its maximum, and rescales O only then; the others rescale every tile, with no vote.
    assert src.plan.lazy_rescale == (src.spec.score is None)
    votes = sum(opcode.startswith("VOTE.ANY") for opcode, _ in census.by_entry(sass)[src.entry])
    assert (votes > 0) == src.plan.lazy_rescale, votes
