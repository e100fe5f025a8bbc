"""Reading .mask sources: the main file, and the files it imports, inside a sandbox.

An ``import "x.mask"`` names a relative path to a ``.mask`` file. It is looked for under the importing
file's directory, then under each directory of the explicit search path (``import_paths=`` in
:func:`maskc.load` / :func:`maskc.compile_mask`, ``--import-path`` on the command line), in order. It
never leaves the directory it is found under: absolute paths, ``..`` components and symlinks that
resolve outside are errors, as are files that are not regular (devices, FIFOs) or larger than
``MAX_SOURCE_BYTES``. Errors name paths, never another file's content: a file outside the sandbox is
never read.
"""
from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path, PurePath
from typing import Iterable, Union

from maskc import ir
from maskc.errors import MaskFileError, MaskSyntaxError, Span

# Where imports are looked for after the importing file's directory: directories, or one alone.
ImportPaths = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]

MAX_SOURCE_BYTES = 1 << 20          # 1 MiB: a .mask file is a few KB
_NAME_MAX = 255                     # bytes in one path component (Linux, macOS)
_PATH_MAX = 4096


def read_source(path: Path, span: Span | None = None, regular_only: bool = False) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark skipped), read up to MAX_SOURCE_BYTES (a larger file, or one that does not end,
    such as /dev/zero, is an error). ``regular_only``: refuse devices, FIFOs and sockets (imports)."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_NONBLOCK", 0) if regular_only else 0))
        with os.fdopen(fd, "rb") as f:
            if regular_only and not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise MaskFileError(f"cannot read {path}: not a regular file", span)
            data = f.read(MAX_SOURCE_BYTES + 1)
    except MaskFileError:                       # an OSError too: the not-regular refusal above, as it is
        raise
    except (OSError, ValueError) as err:        # ValueError: a NUL byte in the name
        reason = getattr(err, "strerror", None) or "not a valid file name"
        raise MaskFileError(f"cannot read {path}: {reason}", span) from None
    if len(data) > MAX_SOURCE_BYTES:
        raise MaskFileError(f"cannot read {path}: larger than {MAX_SOURCE_BYTES >> 20} MiB, the limit for a "
                              ".mask file", span)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        # utf-8-sig counts from past the byte-order mark
        offset = err.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        raise MaskSyntaxError(f"this file is not UTF-8 text: byte 0x{data[offset]:02x} is not a character",
                              _byte_span(path, data, offset),
                              "save the file as UTF-8" + (f" (it is imported at {span})" if span else "")) from None


def _byte_span(path: Path, data: bytes, offset: int) -> Span:
    """The place of byte ``offset`` of ``data`` as a caret can show it: its line, and its column in characters
    (what comes before it on the line decodes, as it precedes the first byte that does not)."""
    start = data.rfind(b"\n", 0, offset) + 1
    end = data.find(b"\n", offset)
    line = data[start:end if end >= 0 else len(data)]
    before = data[start:offset].decode("utf-8-sig" if start == 0 else "utf-8")
    return Span(str(path), data.count(b"\n", 0, offset) + 1, len(before) + 1, 1,
                line.decode("utf-8-sig" if start == 0 else "utf-8", errors="replace"))


def _relative_name(imp: ir.ImportDecl) -> PurePath:
    """The import's path, checked to be a plain relative name of a .mask file."""
    text = imp.path
    if not text or any(ord(c) < 32 or c == "\x7f" for c in text):
        raise MaskSyntaxError("an import names a file: this one is empty or holds control characters", imp.span)
    name = PurePath(text)
    if name.is_absolute() or text.startswith("~"):
        raise MaskSyntaxError(f"cannot import '{text}': an import is a path relative to the importing file's "
                              "directory or to a search path, not an absolute one", imp.span,
                              "pass the directory with --import-path (import_paths= in Python) and import "
                              "the file by its name")
    if ".." in name.parts:
        raise MaskSyntaxError(f"cannot import '{text}': '..' would leave the importing file's directory",
                              imp.span, "pass the directory with --import-path (import_paths= in Python)")
    if name.suffix != ".mask":
        raise MaskSyntaxError(f"cannot import '{text}': only .mask files can be imported", imp.span)
    if len(os.fsencode(text)) > _PATH_MAX or any(len(os.fsencode(p)) > _NAME_MAX for p in name.parts):
        raise MaskSyntaxError(f"cannot import '{text[:80]}...': the file name is too long", imp.span)
    return name


def find_import(imp: ir.ImportDecl, here: Path, search: tuple[Path, ...]) -> Path:
    """The resolved path of an import (see the module docstring), or a located MaskSyntaxError."""
    name = _relative_name(imp)
    for root in (here, *search):
        try:
            base = root.resolve()
            found = (base / name).resolve()
            if not os.path.lexists(base / name):
                continue
        except (OSError, RuntimeError):         # RuntimeError: a symlink loop (Python < 3.13)
            raise MaskSyntaxError(f"cannot import '{imp.path}': its path cannot be resolved (a symlink loop?)",
                                  imp.span) from None
        if not found.is_relative_to(base):
            raise MaskSyntaxError(f"cannot import '{imp.path}': it is a symlink to a file outside {root}",
                                  imp.span, "imports stay under the importing file's directory or a search path")
        if not found.exists():
            raise MaskSyntaxError(f"cannot import '{imp.path}': a broken symlink", imp.span)
        return found
    where = ", ".join(str(r) for r in (here, *search))
    raise MaskSyntaxError(f"cannot import '{imp.path}': no such file", imp.span, f"looked in: {where}")


def search_path(import_paths: ImportPaths) -> tuple[Path, ...]:
    """The explicit search path: existing directories, in order; one directory may be given alone (a str is
    a path, not a sequence of one-letter directories)."""
    if isinstance(import_paths, (str, os.PathLike)):
        import_paths = (import_paths,)
    out = []
    for p in import_paths:
        path = Path(p)
        if not path.is_dir():
            raise MaskSyntaxError(f"import path {path} is not a directory")
        out.append(path)
    return tuple(out)
