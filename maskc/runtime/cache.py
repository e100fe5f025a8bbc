"""The disk cache: compiled kernels (cubins, PTX) and autotuning results, in one directory that
processes share.

Where (:func:`location`): ``$MASKC_CACHE_DIR`` when set; else ``$XDG_CACHE_HOME/maskc`` when that is an
absolute path (the XDG rule: a relative one is ignored); else ``<home>/.cache/maskc``, the home taken from
``$HOME``, or from the password database when ``$HOME`` is empty or relative. A home that is ``/`` or
unknown gives no cache directory: never ``/.cache``.

How (:class:`DiskCache`): an entry is named by a hash of everything that produced it, so a stale entry
is never read and any process may write any entry. Every write goes to a temporary file in the same
directory, then is renamed over the entry: a reader sees no file or the whole file, never a part. A
directory that cannot be created or written (read-only, full, a file in its place) or no directory at
all degrades to no disk cache: one :class:`CacheWarning`, then the process keeps what it produces in a
private temporary directory, removed when it exits.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Mapping

TUNING_FILE = "autotune.json"
_KERNEL_SUFFIXES = (".cubin", ".ptx")
_KERNEL_PREFIX = "maskc_"          # every kernel entry point's name starts with it


class CacheWarning(UserWarning):
    """The disk cache cannot be used; maskc goes on without it."""


def location(env: Mapping[str, str]) -> Path | None:
    """The cache directory for the environment variables ``env``, or None (see the module docstring).
    Reads them and the password database, nothing else: the directory need not exist. (The process's
    environment is read only by :class:`maskc.options.Options`, which calls this.)"""
    explicit = env.get("MASKC_CACHE_DIR", "")
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "maskc"
    for home in (env.get("HOME", ""), _passwd_home()):
        if home and os.path.isabs(home) and Path(home) != Path(home).parent:     # absolute, and not "/"
            return Path(home) / ".cache" / "maskc"
    return None


def _passwd_home() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_dir or ""
    except (ImportError, KeyError, OSError):
        return ""


def _write_atomic(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="tmp", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


class DiskCache:
    """Entries by name in ``root`` (None: no cache directory); see the module docstring."""

    def __init__(self, root: Path | None):
        self.root = root
        self._usable = root is not None
        self._warned = False
        self._scratch: Path | None = None
        self._lock = threading.Lock()

    @property
    def usable(self) -> bool:
        """Whether entries are kept for later processes (False once a write has failed)."""
        return self._usable

    def path_of(self, name: str) -> Path | None:
        """Where entry ``name`` is, if it exists (in the cache, or in this process's scratch directory)."""
        for directory in (self.root if self._usable else None, self._scratch):
            if directory is not None and (directory / name).is_file():
                return directory / name
        return None

    def read(self, name: str) -> bytes | None:
        path = self.path_of(name)
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError:
            return None

    def write(self, name: str, data: bytes) -> Path:
        """Store entry ``name`` atomically; where the cache cannot take it, in the scratch directory."""
        if self._usable:
            try:
                return _write_atomic(self.root / name, data)       # type: ignore[operator]
            except OSError as err:
                self._degrade(f"cannot write to the cache directory {self.root}: {err.strerror or err}")
        elif self.root is None:
            self._degrade("no cache directory: $HOME is empty or '/', and neither $MASKC_CACHE_DIR nor "
                          "$XDG_CACHE_HOME is set")
        return _write_atomic(self._scratch_dir() / name, data)

    def artifact(self, name: str, produce: Callable[[], bytes]) -> tuple[Path, bool]:
        """A file holding entry ``name``: the stored one, else ``produce()``'s bytes, stored; and whether
        ``produce`` ran."""
        found = self.path_of(name)
        if found is not None:
            return found, False
        return self.write(name, produce()), True

    def files(self) -> list[Path]:
        """The files maskc wrote in the cache directory (never another program's), sorted."""
        if self.root is None or not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_file() and (
            (p.suffix in _KERNEL_SUFFIXES and p.name.startswith(_KERNEL_PREFIX)) or p.name == TUNING_FILE
            or (p.suffix == ".tmp" and p.name.startswith("tmp"))))

    def clear(self) -> tuple[int, int]:
        """Delete :meth:`files`: (how many, how many bytes)."""
        files = self.files()
        size = sum(p.stat().st_size for p in files)
        for p in files:
            p.unlink(missing_ok=True)
        return len(files), size

    def _degrade(self, why: str) -> None:
        with self._lock:
            self._usable = False
            if self._warned:
                return
            self._warned = True
        warnings.warn(f"maskc: {why}; going on without a disk cache (compiled kernels are not kept for later "
                      "runs; set MASKC_CACHE_DIR to a writable directory)", CacheWarning, stacklevel=3)

    def _scratch_dir(self) -> Path:
        with self._lock:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="maskc-"))
                atexit.register(shutil.rmtree, self._scratch, True)
            return self._scratch


_caches: dict[Path | None, DiskCache] = {}
_caches_lock = threading.Lock()


def at(root: Path | None) -> DiskCache:
    """The cache in directory ``root`` (None: none), one object per directory, so one warning per process."""
    with _caches_lock:
        if root not in _caches:
            _caches[root] = DiskCache(root)
        return _caches[root]


__all__ = ["CacheWarning", "DiskCache", "TUNING_FILE", "at", "location"]
