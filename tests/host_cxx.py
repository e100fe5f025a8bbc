"""Device code built for the host: the tests run the C++ that kernels include (generated predicates, score
modifiers, the descriptor builder's checks, the plain-C++ parts of templates) under g++, as a shared library
loaded with ctypes. One build per distinct source and flags in a test session."""
from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")
QUIET = ("-O1", "-w")            # generated code: its unused parameters and helpers are not the test's subject

_BUILD = Path(tempfile.mkdtemp(prefix="maskc_host_"))
_LIBRARIES: dict[str, ctypes.CDLL] = {}


def build_library(source: str, what: str = "it", flags: tuple[str, ...] = QUIET) -> ctypes.CDLL:
    """``source`` compiled by g++ (C++17 and ``flags``) into a shared library, loaded; the same source and flags
    return the library built first. A source g++ rejects fails the test with g++'s messages and the file that
    holds the source (``what`` says what it is)."""
    key = hashlib.sha1("\0".join((source, *flags)).encode()).hexdigest()[:16]
    if key not in _LIBRARIES:
        if GXX is None:
            pytest.skip("g++ is not installed")
        cpp, so = _BUILD / f"{key}.cpp", _BUILD / f"{key}.so"
        cpp.write_text(source)
        res = subprocess.run([GXX, *flags, "-shared", "-fPIC", "-std=c++17", str(cpp), "-o", str(so)],
                             capture_output=True, text=True)
        assert res.returncode == 0, f"g++ rejected {what} ({cpp}):\n{res.stderr[:4000]}"
        _LIBRARIES[key] = ctypes.CDLL(str(so))
    return _LIBRARIES[key]
