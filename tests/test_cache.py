"""The disk cache (issue 17, item 7): where it is, atomic writes, and a cache that cannot be written
degrading to none with one warning, for the kernels (maskc.runtime) and for ``maskc cache``."""
import errno
import os
import threading
import warnings

import pytest
from click.testing import CliRunner

import maskc
from maskc.runtime import cache
from maskc.runtime import loader
from maskc.runtime.cache import CacheWarning, DiskCache, location
from maskc.cli import cli

from conftest import EXAMPLES


@pytest.fixture
def no_passwd_home(monkeypatch):
    monkeypatch.setattr(cache, "_passwd_home", lambda: "")


@pytest.mark.parametrize("env, expected", [
    ({"MASKC_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/c"),
    ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/maskc"),
    ({"XDG_CACHE_HOME": "relative", "HOME": "/h"}, "/h/.cache/maskc"),   # XDG: relative paths are ignored
    ({"MASKC_CACHE_DIR": "", "XDG_CACHE_HOME": "", "HOME": "/h"}, "/h/.cache/maskc"),
    ({"HOME": ""}, None), ({"HOME": "/"}, None), ({"HOME": "//"}, None), ({"HOME": "rel"}, None), ({}, None),
])
def test_location(env, expected, no_passwd_home):
    got = location(env)
    assert (None if got is None else str(got)) == expected


def test_an_empty_home_falls_back_to_the_password_database_never_to_the_root(monkeypatch):
    monkeypatch.setattr(cache, "_passwd_home", lambda: "/home/u")
    assert str(location({"HOME": ""})) == "/home/u/.cache/maskc"
    monkeypatch.setattr(cache, "_passwd_home", lambda: "/")
    assert location({"HOME": ""}) is None


def test_cache_info_with_an_empty_home_names_no_directory_under_the_root(monkeypatch, no_passwd_home):
    for name in ("MASKC_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "")
    for sub in ("info", "clear"):
        result = CliRunner().invoke(cli, ["cache", sub])
        assert result.exit_code == 0, result.output
        assert "/.cache" not in result.output
        assert {"info": "cache directory: none", "clear": "from no cache directory"}[sub] in result.output


def test_an_entry_is_produced_once_and_read_back_by_a_new_process(tmp_path):
    calls = []

    def produce():
        calls.append(1)
        return b"cubin bytes"

    path, produced = DiskCache(tmp_path / "c").artifact("maskc_fwd-1.cubin", produce)
    assert produced and path.read_bytes() == b"cubin bytes" and path.parent == tmp_path / "c"
    again, produced = DiskCache(tmp_path / "c").artifact("maskc_fwd-1.cubin", produce)   # a second process
    assert not produced and again == path and calls == [1]
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["maskc_fwd-1.cubin"]      # no temporary left


def test_concurrent_writers_of_one_entry_leave_one_whole_file(tmp_path):
    data = os.urandom(1 << 20)
    start = threading.Barrier(8)
    errors = []

    def worker():
        start.wait()
        try:
            for _ in range(5):
                DiskCache(tmp_path).write("maskc_x.cubin", data)
                assert (tmp_path / "maskc_x.cubin").read_bytes() == data       # never a part of it
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and [p.name for p in tmp_path.iterdir()] == ["maskc_x.cubin"]


def _unwritable(tmp_path, monkeypatch, how):
    if how == "a file in its place":
        root = tmp_path / "file"
        root.write_text("not a directory")
        return root
    monkeypatch.setattr(cache, "_write_atomic", _fail_under(tmp_path / "c"))   # as on a read-only mount
    return tmp_path / "c"                                                       # (root ignores mode bits)


@pytest.mark.parametrize("how", ["a file in its place", "read-only"])
def test_an_unwritable_cache_degrades_with_one_warning(tmp_path, monkeypatch, how):
    root = _unwritable(tmp_path, monkeypatch, how)
    disk = DiskCache(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, produced = disk.artifact("maskc_a.cubin", lambda: b"a")
        second, _ = disk.artifact("maskc_b.cubin", lambda: b"b")
        again, produced_again = disk.artifact("maskc_a.cubin", lambda: b"never")
    assert [w.category for w in caught] == [CacheWarning]
    assert str(root) in str(caught[0].message)
    assert produced and not produced_again and again == first
    assert first.read_bytes() == b"a" and second.read_bytes() == b"b"
    assert not first.is_relative_to(root) and not disk.usable


def _fail_under(root):
    real = cache._write_atomic

    def write(path, data):
        if path.is_relative_to(root):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path, data)
    return write


def test_a_read_only_cache_still_serves_what_it_holds(tmp_path, monkeypatch):
    DiskCache(tmp_path).write("maskc_a.cubin", b"a")
    monkeypatch.setattr(cache, "_write_atomic", _fail_under(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no warning: nothing had to be written
        path, produced = DiskCache(tmp_path).artifact("maskc_a.cubin", lambda: b"never")
    assert not produced and path == tmp_path / "maskc_a.cubin"


class _FakeModule:
    def __init__(self, path):
        self.path = path

    def get_function(self, name):
        return type("F", (), {"max_dynamic_shared_size_bytes": 0})()


def test_load_kernel_with_an_unwritable_cache_compiles_and_warns(tmp_path, monkeypatch):
    # before maskc.runtime.cache: the compile ran, then writing the cubin raised OSError
    cupy = pytest.importorskip("cupy")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MASKC_CACHE_DIR", str(blocker))
    monkeypatch.setattr(loader, "compile_to_cubin", lambda src: b"cubin")
    monkeypatch.setattr(loader, "nvrtc_version", lambda: (12, 0))
    monkeypatch.setattr(cupy, "RawModule", lambda path: _FakeModule(path))
    monkeypatch.setattr(loader, "_kernels", {})
    src = maskc.load(EXAMPLES / "causal.mask").kernel_source(head_dim=64, dtype="bf16")
    with pytest.warns(CacheWarning, match="cannot write to the cache directory"):
        kernel = loader.load_kernel(src)
    assert kernel.compiled and kernel.cubin_path.read_bytes() == b"cubin"
    assert blocker.read_text() == "not a directory"


def test_the_cli_prints_a_cache_warning_as_one_line(tmp_path, monkeypatch):
    import maskc.cli as cli_module

    def command_that_writes():
        DiskCache(tmp_path / "file").write("maskc_x.cubin", b"x")
    (tmp_path / "file").write_text("in the way")
    monkeypatch.setattr(cli_module, "_load", lambda *a, **k: command_that_writes() or _raise())
    result = CliRunner().invoke(cli, ["compile", str(EXAMPLES / "causal.mask"), "-o", str(tmp_path / "k.cu")])
    lines = [line for line in result.stderr.splitlines() if "cache" in line]
    assert lines and lines[0].startswith("warning: maskc: cannot write to the cache directory")
    assert "CacheWarning" not in result.stderr and ".py:" not in result.stderr


def _raise():
    raise maskc.MaskError("stop here")
