"""Every flag of every command, given bad values alone and in random combinations: the command answers with
a message and exit status 1 (or 2 for a malformed command line), never an internal error or a traceback."""
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from maskc import cli_run
from maskc.cli import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HUGE = str(10 ** 20)
BAD_INTS = ["0", "-1", "abc", "", "1.5", HUGE]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "parse_error.mask").write_text("mask m(\n  allow k <=\n")
    (d / "resolve_error.mask").write_text("mask m(w: int)\n  allow k <= q, q - k < ww\n")
    (d / "empty.mask").write_text("")
    (d / "binary.mask").write_bytes(b"\xff\xfe\x00\x01mask")
    (d / "two.mask").write_text("mask a()\n  allow k <= q\nmask b(w: int)\n  allow q - k < w\n")
    (d / "adir").mkdir()
    (d / "escape.mask").write_text('import "../../../../etc/passwd.mask"\nmask m()\n  allow k <= q\n')
    (d / "deep.mask").write_text("mask m()\n  allow k <= " + "-" * 3000 + "q\n")
    return d


def _file_values(d):
    return [str(d / "missing.mask"), str(d / "adir"), str(d / "empty.mask"), str(d / "binary.mask"),
            str(d / "parse_error.mask"), str(d / "resolve_error.mask"), str(d / "two.mask"), "/dev/null",
            str(d / ("x" * 300 + ".mask")), str(d / "nul\x00.mask"), "/dev/zero", str(d / "escape.mask"),
            str(d / "deep.mask")]


def _commands(d):
    """Per command: a valid command line (FILE first), and per option the bad values to try."""
    out_bad = [str(d / "no" / "such" / "dir" / "x"), str(d / "adir"), "/dev/full", ""]
    params = ["x", "=3", "window=", "window=a", "window=1,2", "window=1;2;3", "nope=3", f"window={HUGE}",
              "window=-5", "docs=1,2", "window=3", "window=3"]
    return {
        "compile": ([str(EXAMPLES / "sliding_window.mask"), "-o", str(d / "k.cu")], {
            "-m": ["nope", "", "causal"], "-o": out_bad, "--head-dim": ["0", "96", "abc", "256"],
            "--dtype": ["fp32", ""], "--block-m": BAD_INTS + ["7", "96", "100000"],
            "--block-n": BAD_INTS + ["7", "100000"], "--engine": ["x", "wgmma_tma", ""],
            "--param": params + ["width=0"], "--backward": [None], "--check": [None],
            "-I": [str(d / "missing"), str(d / "empty.mask"), ""]}),
        "run": ([str(EXAMPLES / "sliding_window.mask"), "--seq-len", "48", "--param", "window=8", "--heads", "1",
                 "--head-dim", "64"], {
            "-m": ["nope", ""], "--seq-len": BAD_INTS + [str(2 ** 31), "100000"], "--kv-len": BAD_INTS + ["7"],
            "--param": params, "--heads": BAD_INTS + ["100000"], "--head-dim": ["0", "96", "256"],
            "--dtype": ["fp32"], "--batch": BAD_INTS + ["3", "100000"], "--seed": BAD_INTS + [str(2 ** 70)],
            "--tolerance": ["0", "-1", "nan", "abc", "inf", "1e-30"], "--backward": [None]}),
        "show": ([str(EXAMPLES / "document.mask"), "--seq-len", "64", "--param", "docs=30,34"], {
            "-m": ["nope"], "--seq-len": BAD_INTS + [str(2 ** 31)], "--kv-len": BAD_INTS,
            "--param": params + ["docs=64;1,63", "docs=", "docs=-1,65"], "--heads": BAD_INTS,
            "--block-m": BAD_INTS + ["1000"], "--block-n": BAD_INTS + ["1"], "--png": out_bad + [str(d / "p.txt")],
            "--dense": [None]}),
        "explain": ([str(EXAMPLES / "document.mask"), "--seq-len", "64", "--param", "docs=30,34"], {
            "-m": ["nope"], "--seq-len": BAD_INTS, "--kv-len": BAD_INTS, "--param": params,
            "--heads": BAD_INTS, "--block-m": BAD_INTS, "--block-n": BAD_INTS, "--head-dim": ["0", "256"],
            "--dtype": ["x"]}),
        "lint": ([str(EXAMPLES / "causal.mask")], {"--format": ["xml", ""], "--strict": [None],
                                                    "--import-path": [str(d / "missing"), ""]}),
    }


def _invoke(args, monkeypatch_env=None):
    result = CliRunner().invoke(cli, args, env=monkeypatch_env, catch_exceptions=True)
    text = result.output
    assert "internal error" not in text and "Traceback" not in text, (args, text)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, text)
    if result.exit_code:
        assert text.strip(), (args, "an error exit without a message")
    return result


def _with(base, option, value):
    """``base`` with ``option`` set to ``value`` (replacing its value there, if any); value None: a flag."""
    args = list(base)
    if value is None:
        return args + [option]
    if option in args and option != "--param":
        args[args.index(option) + 1] = value
        return args
    return args + [option, value]


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(cli_run, "gpu_available", lambda: False)
    monkeypatch.setenv("MASKC_CACHE_DIR", str(tmp_path / "cache"))


def _cases(d):
    for command, (base, options) in _commands(d).items():
        yield command, [command] + base
        for option, values in options.items():
            for value in values:
                yield command, [command] + _with(base, option, value)
        for path in _file_values(d):
            yield command, [command, path] + base[1:]


def test_each_bad_value_alone(files):
    cases = list(_cases(files))
    assert len(cases) > 250
    failures = []
    for _, args in cases:
        try:
            _invoke(args)
        except AssertionError as err:
            failures.append(str(err)[:300])
    assert not failures, f"{len(failures)} of {len(cases)}:\n" + "\n".join(failures)


def test_random_combinations_of_bad_values(files):
    rng = random.Random(18)
    commands = _commands(files)
    for _ in range(150):
        command = rng.choice(sorted(commands))
        base, options = commands[command]
        args = list(base)
        if rng.random() < 0.3:
            args[0] = rng.choice(_file_values(files))
        for option in rng.sample(sorted(options), k=min(len(options), rng.randint(2, 4))):
            args = _with(args, option, rng.choice(options[option]))
        _invoke([command] + args)


def test_usage_errors_and_the_bare_command():
    assert _invoke([]).exit_code in (0, 2)
    assert _invoke(["nope"]).exit_code == 2
    assert _invoke(["compile"]).exit_code == 2
    assert _invoke(["run", str(EXAMPLES / "causal.mask")]).exit_code == 2          # --seq-len is required
    assert _invoke(["explain", str(EXAMPLES / "causal.mask"), "--param", "x=1"]).exit_code == 2
    assert _invoke(["cache"]).exit_code in (0, 2)
    assert _invoke(["cache", "wipe"]).exit_code == 2


def test_cache_commands_with_a_cache_dir_that_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for sub in ("info", "clear"):
        _invoke(["cache", sub], {"MASKC_CACHE_DIR": str(blocker)})
    assert blocker.read_text() == "not a directory"
