"""What the ``maskc`` subcommands share: the defaults, the options, ``--param`` parsing, and the error for
a bad command line or machine. ``maskc.cli`` builds the commands from these."""
from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

import click

from maskc import ir

if TYPE_CHECKING:
    from maskc.options import Options
    from maskc.pipeline import BoundMask, CompiledMask

# One default per knob for every command that has it: `compile` writes the kernel that `run` runs.
DEFAULT_HEAD_DIM = 128
DEFAULT_DTYPE = "bf16"
HEAD_DIMS = ("64", "128", "256")
DTYPES = ("bf16", "fp16")


class CliError(click.ClickException):
    """A problem with the command line or the machine, not the mask: ``maskc: error: ...``, exit 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"maskc: error: {self.message}", err=True)


def gpu_available() -> bool:
    """Whether CuPy sees a CUDA device (False without CuPy, a driver or a GPU)."""
    try:
        import cupy
        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def environment_options() -> "Options":
    """The options the MASKC_* environment variables set (a command's flags override them); a variable
    with a value maskc cannot take is a CliError naming it."""
    from maskc.options import Options
    try:
        return Options.from_environment()
    except ValueError as err:
        raise CliError(str(err)) from None


def load_mask(path: str, name: str | None, import_paths: tuple[str, ...] = ()) -> "CompiledMask":
    from maskc.pipeline import load
    return load(path, name, import_paths)


def bad_param(message: str) -> NoReturn:
    raise click.BadParameter(message, param_hint="'--param'")


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        bad_param(f"{what}: expected integers separated by ',', got {text!r}")


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        bad_param(f"{what}: expected numbers separated by ',', got {text!r}")


# The lengths the commands take as flags, not as --param (bind's own arguments)
LENGTH_FLAGS = {"seq_len": "--seq-len", "kv_len": "--kv-len", "num_heads": "--heads"}


def parse_params(mask: "CompiledMask", raw: tuple[str, ...]) -> dict[str, Any]:
    """``name=value`` strings to bind's keyword arguments: an int (a float for ``float`` parameters), or a comma
    list for segments, per arrays and tables (floats for float tables); ``/`` separates the rows of a table with
    two indices (or per h with one); ``;`` separates batch elements (jagged batches). Names the mask does not
    declare pass through: bind reports them, with the names it does declare."""
    kinds = {p.name: p.kind for p in mask.params}
    rows = {p.name for p in mask.params if p.kind == "table" and (p.dims == 2 or (p.of == "h" and p.dims == 1))}
    values: dict[str, Any] = {}
    for item in raw:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            bad_param(f"{item!r}: expected name=value")
        if name in values:
            bad_param(f"{name} is given twice")
        if name in LENGTH_FLAGS:           # bind takes these itself: passed on, they reached it twice
            bad_param(f"{name} is not a parameter of the mask: give it with {LENGTH_FLAGS[name]}")
        elements: list[Any] = []
        for part in text.split(";"):
            nums = [] if name in rows else _floats(part, name) if kinds.get(name) in ir.FLOAT_KINDS else _ints(part, name)
            if kinds.get(name) in ("int", "float") or (name not in kinds and "," not in part):
                if len(nums) != 1:
                    what = "a float: give one number" if kinds.get(name) == "float" else "an int: give one integer"
                    bad_param(f"{name} is {what} per batch element, got {part!r}")
                elements.append(nums[0])
            elif name in rows:
                elements.append([_ints(row, name) for row in part.split("/")])
            else:
                elements.append(nums)
        values[name] = elements if len(elements) > 1 else elements[0]
    return values


def bind_from_cli(mask: "CompiledMask", seq_len: int, kv_len: int | None, raw_params: tuple[str, ...],
                  heads: int) -> "BoundMask":
    from maskc.errors import BindError
    values = parse_params(mask, raw_params)
    try:
        # Only a mask that reads h is bound per head (else every head shares one mask).
        return mask.bind(seq_len=seq_len, kv_len=kv_len, num_heads=heads if mask.reads_head else None,
                         params=values)
    except BindError as err:
        # bind names num_heads, which the command line calls --heads (whose default the user may not know)
        count = _heads_given(mask, err, raw_params)
        if err.hint is None and count is not None and count != heads:
            err.hint = f"num_heads is --heads on the command line: pass --heads {count}"
        # 'docs=100;156' for 'docs=100,156': two batch elements, each short of the whole range
        segments = next((p.name for p in mask.params if p.kind == "segments" and p.span == err.span), None)
        if err.hint is None and segments and "sum to" in err.message and any(
                item.partition("=")[0].strip() == segments and ";" in item for item in raw_params):
            err.hint = ("';' starts another batch element, whose lengths cover the whole range again; "
                        "the lengths of one element are separated by ','")
        raise


def _heads_given(mask: "CompiledMask", err: Exception, raw_params: tuple[str, ...]) -> int | None:
    """How many heads the --param of a per-head parameter gives, when ``err`` is bind's complaint about its count."""
    param = next((p for p in mask.params if p.of == "h" and p.span == getattr(err, "span", None)), None)
    if param is None or "one per head" not in str(err):
        return None
    for name, _, text in (item.partition("=") for item in raw_params):
        if name.strip() == param.name:
            first = text.split(";")[0]            # a batch element's values: a row per head, else an entry per head
            return len(first.split("/")) if param.dims or "/" in first else len([x for x in first.split(",")
                                                                                if x.strip()])
    return None


def refuse_overwriting_sources(output: str, flag: str, file: str, import_paths: tuple[str, ...]) -> None:
    """A CliError when ``output`` is the mask file ``file`` or one it imports: ``-o causal.mask``, a slip for
    ``causal.cu``, would replace the user's mask with what the command writes."""
    from maskc.pipeline import load_program
    try:
        if not os.path.exists(output):         # nothing there to lose
            return
        # the imports come from reading the file again: only a regular file reads the same twice (not stdin)
        sources = [f.path for f in load_program(file, import_paths).files] if os.path.isfile(file) else [file]
    except ValueError:                          # a NUL in a name: writing will say so
        return
    for source in sources:
        try:
            same = os.path.samefile(output, source)
        except (OSError, ValueError):
            continue
        if same:
            raise CliError(f"{flag} {output} would replace the mask file {source}, which this command reads; "
                           "write to another file")


def _descriptor_named(path: str) -> int | None:
    """The descriptor of this process that ``path`` names through its symlinks (/dev/stdout, /dev/stderr,
    /dev/fd/N, /proc/self/fd/N), else None. Opening such a name opens the file behind the descriptor anew, from
    its start and truncated, where the descriptor itself goes on where the shell opened it: `-o /dev/stdout >>
    all.cu` appends to all.cu only when written through descriptor 1."""
    own = {os.path.realpath("/proc/self/fd"), os.path.realpath("/dev/fd")}
    current = os.path.abspath(path)
    for _ in range(40):                     # a symlink chain longer than the kernel's own limit: not ours
        parent, name = os.path.split(current)
        try:
            if name.isdigit() and os.path.realpath(parent) in own:
                return int(name)
            if not os.path.islink(current):
                return None
            current = os.path.normpath(os.path.join(parent, os.readlink(current)))
        except (OSError, ValueError):       # ValueError: a NUL in the name (writing will say so)
            return None
    return None


def _write_to_descriptor(descriptor: int, data: bytes) -> None:
    """All of ``data`` to an open descriptor, after what Python's own streams hold for it (the order of output)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view):]


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """Where to write the new content of the file ``path``: a file beside it that replaces it only once written
    whole, so that a write that fails (a full disk) leaves what was there; it keeps the old file's permission
    bits. A name of one of this process's descriptors (/dev/stdout, /dev/fd/3) is written through that
    descriptor, once the content is whole: `-o /dev/stdout >> all.cu` appends to all.cu, as the shell opened
    it. Anything else but a regular file or a new name (a symlink, /dev/null, a FIFO) is written in place."""
    descriptor = _descriptor_named(path)
    if descriptor is not None:
        with tempfile.TemporaryDirectory(prefix="maskc-") as directory:
            temporary = os.path.join(directory, "output")
            yield temporary
            _write_to_descriptor(descriptor, Path(temporary).read_bytes())
        return
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        found = None
    if found is not None and not stat.S_ISREG(found.st_mode):
        yield path
        return
    mode = stat.S_IMODE(found.st_mode) if found is not None else 0o666 & ~_umask()
    try:
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                                         prefix=f".{os.path.basename(path)[:64]}.", suffix=".tmp")
    except PermissionError:
        if found is None:
            raise
        yield path                  # a directory closed to new files, a file open to writes: in place
        return
    os.close(fd)
    try:
        yield temporary
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_output(path: str, text: str) -> None:
    """``text`` into the file ``path`` ('-': stdout), replacing it only once written whole; a path that cannot be
    written is a CliError."""
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        with replacing(path) as temporary:
            Path(temporary).write_text(text, encoding="utf-8")
    except OSError as err:
        raise CliError(f"cannot write {path}: {err.strerror or err}") from None


mask_option = click.option("-m", "--mask", "name", metavar="NAME", help="which mask, when the file defines several")
import_path_option = click.option(
    "-I", "--import-path", "import_paths", multiple=True, metavar="DIR",
    type=click.Path(exists=True, file_okay=False), help="a directory where imports are looked for after the "
    "importing file's own (repeatable); imports never leave these directories")
param_option = click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
                            help="a parameter: 7, or 100,200,724 for segments; '/' between a table's rows; ';' between batch "
                            "elements")
seq_len_option = click.option("--seq-len", type=click.IntRange(min=1), required=True, help="query length")
kv_len_option = click.option("--kv-len", type=click.IntRange(min=1), help="key length (default: seq_len)")
head_dim_option = click.option("--head-dim", type=click.Choice(HEAD_DIMS), default=str(DEFAULT_HEAD_DIM),
                               show_default=True, help="D, the length of each query, key and value vector")
dtype_option = click.option("--dtype", type=click.Choice(DTYPES), default=DEFAULT_DTYPE, show_default=True,
                            help="element type of Q, K, V and O")
