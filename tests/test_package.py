"""The wheel: built from the checkout, installed into a fresh venv, usable from outside the checkout."""
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SNIPPET = textwrap.dedent("""
    import sys, pathlib
    import maskc
    from maskc.resources import data_dir
    here = pathlib.Path(maskc.__file__).resolve().parent
    import os
    assert str(here).startswith(os.environ["MASKC_TEST_VENV"]), here
    examples = data_dir("examples")
    assert examples.resolve().is_relative_to(here), examples
    names = sorted(p.stem for p in examples.glob("*.mask"))
    assert "causal" in names and "hstu" in names, names
    assert data_dir("grammars").resolve().is_relative_to(here)
    assert data_dir("templates").resolve().is_relative_to(here)
    mask = maskc.load(examples / "sliding_window.mask")
    src = mask.kernel_source(head_dim=64, dtype="bf16")
    assert src.entry in src.source and "mask_visible" in src.source, src.entry
    d = mask.bind(16, window=3).dense()
    assert int(d.sum()) == 16 * 3 - 3
    print("OK", len(names), src.entry)
""")


DEPENDENCIES_PRESENT = textwrap.dedent("""
    import re
    from importlib.metadata import requires, version
    for req in requires("maskc"):
        if "extra ==" not in req:
            version(re.split(r"[<>=!~;\\[ ]", req, maxsplit=1)[0])   # PackageNotFoundError if missing
""")


def _run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{cmd} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def test_wheel_installs_and_works_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    try:
        _run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
              "-w", str(wheels)], cwd=tmp_path, env=env)
    except AssertionError as err:
        if "hatchling" in str(err) and "No module named" in str(err):
            pytest.skip("hatchling is not installed for a build without isolation")
        raise
    (wheel,) = wheels.glob("maskc-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for needed in ("maskc/grammars/mask.lark", "maskc/examples/causal.mask", "maskc/pipeline.py", "maskc/py.typed",
                   "maskc-0.1.0.dist-info/licenses/LICENSE"):
        assert needed in names, needed
    assert any(n.startswith("maskc/templates/") for n in names)
    assert not any(n.startswith("tests/") for n in names)

    # A fresh venv that sees this environment's packages (the wheel's dependencies, installed offline) but
    # not its maskc: a .pth naming this interpreter's site directories adds them as plain paths, so their own
    # .pth files (an editable maskc's among them) are not run. (--system-site-packages would give the base
    # interpreter's packages instead, which a venv running the tests need not have: lark, say.)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    site_dir = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    parent = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site_dir / "_parent_environment.pth").write_text("".join(f"{p}\n" for p in sorted(parent)))
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel)], env=env)
    _run([str(py), "-c", DEPENDENCIES_PRESENT], env=env)   # every dependency the wheel declares is there
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    clean = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    clean["MASKC_TEST_VENV"] = str(venv.resolve())
    res = _run([str(py), "-c", SNIPPET], cwd=outside, env=clean)
    n_examples = len(list((ROOT / "examples").glob("*.mask")))
    assert res.stdout.startswith(f"OK {n_examples} maskc_fwd_sliding_window"), res.stdout
    # the console script is installed too
    res = _run([str(venv / "bin" / "maskc"), "lint", str(ROOT / "examples" / "causal.mask")], cwd=outside, env=clean)
    assert "0 error(s)" in res.stdout + res.stderr
