"""examples/train_packed.py at toy size on the CPU reference path: training through maskc's autograd op
(a new document mask bound every step) makes the loss fall well below the uniform guess."""
import importlib.util
import math
import subprocess
import sys

import pytest

from conftest import EXAMPLES

pytest.importorskip("torch")


def test_packed_training_loss_decreases():
    spec = importlib.util.spec_from_file_location("train_packed", EXAMPLES / "train_packed.py")
    train_packed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_packed)
    losses = train_packed.train(steps=60, seq_len=96, device="cpu", log=lambda *_: None)
    assert all(math.isfinite(x) for x in losses)
    late = sum(losses[-10:]) / 10
    assert late < math.log(64) - 1.0, f"loss did not fall: {losses[0]:.3f} -> {late:.3f}"


def test_packed_training_with_the_mask_bound_on_the_device_api():
    """The same run with ``bind="device"``: one bind_on_device, each batch's lengths written with update (on the
    CPU the table is a CPU tensor and attention reads its dense form): the losses are the host-bound run's."""
    spec = importlib.util.spec_from_file_location("train_packed", EXAMPLES / "train_packed.py")
    train_packed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_packed)
    host = train_packed.train(steps=8, seq_len=64, device="cpu", log=lambda *_: None)
    device = train_packed.train(steps=8, seq_len=64, device="cpu", bind="device", log=lambda *_: None)
    assert host == pytest.approx(device, rel=1e-5)
    with pytest.raises(ValueError, match="cuda-graph"):
        train_packed.train(steps=1, seq_len=64, device="cpu", cuda_graph=True)


def test_cuda_graph_where_it_cannot_run_is_a_usage_error():
    """--cuda-graph on the CPU (or with a host bind): argparse's one-line error and status 2, no traceback."""
    for args in (["--cuda-graph", "--cpu", "--bind", "device"], ["--cuda-graph"]):
        proc = subprocess.run([sys.executable, str(EXAMPLES / "train_packed.py"), *args, "--steps", "1"],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "error: --cuda-graph needs the GPU" in proc.stderr
