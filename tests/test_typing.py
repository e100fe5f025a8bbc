"""maskc ships type information (py.typed): the package type-checks with mypy under pyproject's config."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_package_marks_itself_typed():
    assert (ROOT / "maskc" / "py.typed").is_file()


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')")
def test_mypy_is_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
