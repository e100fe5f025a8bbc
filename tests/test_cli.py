"""The maskc command: each subcommand end to end, and errors that never show a traceback."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import maskc
from maskc import cli as cli_module
from maskc import cli_run
from maskc.cli import cli, parse_params
from maskc.options import Options
from maskc.runtime.cpu_check import blocked_attention, cubin_registers, round_to

ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cli_run, "gpu_available", lambda: False)


@pytest.fixture
def bad_file(tmp_path):
    path = tmp_path / "bad.mask"
    path.write_text("mask m(window: int)\n  allow k <= q, q - k < windw\n")
    return path


# -- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["compile", "{f}", "-o", "{tmp}/k.cu"], ["run", "{f}", "--seq-len", "64"], ["show", "{f}", "--seq-len", "64"],
    ["explain", "{f}"],
])
def test_mask_errors_show_file_line_col_and_caret(bad_file, tmp_path, command):
    result = invoke(*[a.format(f=bad_file, tmp=tmp_path) for a in command])
    assert result.exit_code == 1
    assert f"{bad_file}:2:25: error: unknown name 'windw'" in result.stderr
    assert "  allow k <= q, q - k < windw\n" in result.stderr
    assert re.search(r"\n +\^~~~~\n", result.stderr)
    assert "hint: did you mean 'window'?" in result.stderr


def test_bind_error_points_at_the_parameter():
    result = invoke("show", EXAMPLES / "document.mask", "--seq-len", 100, "--param", "docs=10,20")
    assert result.exit_code == 1
    assert "document.mask:2:15: error: segments 'docs' sum to 30" in result.stderr


@pytest.mark.parametrize("command", [["compile", "{f}"], ["compile", "{f}", "--backward", "-o", "{tmp}/k.cu"],
                                     ["run", "{f}", "--seq-len", "64"], ["show", "{f}", "--seq-len", "64"],
                                     ["explain", "{f}"]])
@pytest.mark.parametrize("what,reason", [("nope.mask", "No such file or directory"), (".", "Is a directory")])
def test_missing_file_is_a_clean_error(tmp_path, command, what, reason):
    """A main file that cannot be read: one line naming it and why, exit 1, nothing on stdout, no traceback."""
    path = tmp_path / what
    result = invoke(*[a.format(f=path, tmp=tmp_path) for a in command])
    assert result.exit_code == 1 and result.stdout == "" and not (tmp_path / "k.cu").exists()
    assert result.stderr == f"error: cannot read {path}: {reason}\n"


def test_internal_errors_exit_2_without_traceback(monkeypatch):
    def broken(*a, **k):
        raise KeyError("oops")
    monkeypatch.setattr(cli_module, "_load", broken)
    result = invoke("explain", EXAMPLES / "causal.mask", "-m", "causal")
    assert result.exit_code == 2
    assert result.stderr.startswith("maskc: internal error: KeyError")


def test_entry_point_runs_as_a_module_and_prints_no_traceback(bad_file):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "maskc", "compile", str(bad_file)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert f"{bad_file}:2:25: error: unknown name 'windw'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


# -- compile ----------------------------------------------------------------------------------

def test_compile_writes_the_kernel(tmp_path):
    out = tmp_path / "k.cu"
    result = invoke("compile", EXAMPLES / "document.mask", "-o", out, "--head-dim", 64, "--dtype", "fp16")
    assert result.exit_code == 0, result.output
    source = out.read_text()
    assert 'extern "C" __global__' in source and "maskc_fwd_document" in source
    assert "maskc_fwd_document (head_dim 64, fp16" in result.stderr


@pytest.mark.parametrize("engine", ["mma", "wgmma_tma"])
def test_compile_engine_picks_the_kernel(tmp_path, engine):
    out = tmp_path / "k.cu"
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", out, "--engine", engine)
    assert result.exit_code == 0, result.output
    assert out.read_text() == maskc.load(EXAMPLES / "causal.mask").kernel_source(engine=engine).source
    assert f", {engine})" in result.stderr


def test_compile_check_runs_nvrtc_and_reports_registers(tmp_path):
    pytest.importorskip("cupy")
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", tmp_path / "k.cu", "--check")
    assert result.exit_code == 0, result.output
    match = re.search(r"NVRTC: ok, (\d+) byte cubin; registers per thread: (\d+) \(maskc_fwd_causal\)", result.stderr)
    assert match and 32 <= int(match.group(2)) <= 255


def test_compile_backward_writes_every_kernel(tmp_path):
    pytest.importorskip("cupy")
    out = tmp_path / "bwd.cu"
    result = invoke("compile", EXAMPLES / "document.mask", "-o", out, "--backward", "--head-dim", "64", "--check")
    assert result.exit_code == 0, result.output
    source = out.read_text()
    for entry in ("prep", "dkdv", "dkdv_det", "dq", "dq_convert"):
        assert f"maskc_bwd_{entry}_document(" in source
        assert re.search(rf"\d+ \(maskc_bwd_{entry}_document\)", result.stderr), result.stderr
    bad = invoke("compile", EXAMPLES / "document.mask", "-o", out, "--backward", "--head-dim", "256", "--engine", "mma")
    assert bad.exit_code == 1 and "head dim 256" in bad.stderr and "Traceback" not in bad.output
    hd256 = invoke("compile", EXAMPLES / "document.mask", "-o", out, "--backward", "--head-dim", "256")   # Hopper's
    assert hd256.exit_code == 0 and "SPLIT_HEAD_DIM = true" in out.read_text(), hd256.output


def test_compile_backward_engine(tmp_path):
    out = tmp_path / "bwd.cu"
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", out, "--backward", "--engine", "wgmma")
    assert result.exit_code == 0 and ", wgmma)" in result.stderr, result.output
    assert "wgmma.mma_async" in out.read_text()
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", out, "--backward", "--engine", "wgmma_tma")
    assert result.exit_code == 0 and ", wgmma_tma)" in result.stderr, result.output
    assert "setmaxnreg" in out.read_text() and "cp.reduce.async.bulk" in out.read_text()
    bad = invoke("compile", EXAMPLES / "causal.mask", "-o", out, "--engine", "wgmma")     # a backward engine only
    assert bad.exit_code == 1 and "engine 'wgmma'" in bad.stderr and "Traceback" not in bad.output


def test_cubin_registers_reads_the_elf():
    pytest.importorskip("cupy")
    from maskc.codegen.emit import compile_to_cubin
    cubin = compile_to_cubin(maskc.load(EXAMPLES / "causal.mask").kernel_source(head_dim=64, dtype="bf16"))
    assert 32 <= cubin_registers(cubin) <= 255
    assert cubin_registers(b"not an elf") is None


def test_registers_by_kernel_agree_with_ptxas():
    """The ELF reader against ptxas's own report (NVRTC with -v) for a source of five kernels."""
    pytest.importorskip("cupy")
    from cupy.cuda import nvrtc
    from maskc.runtime.cpu_check import cubin_registers_by_kernel
    from maskc.codegen.emit import emit_backward_kernel
    src = emit_backward_kernel(maskc.load(EXAMPLES / "causal.mask").backward_spec(head_dim=64))
    prog = nvrtc.createProgram(src.source, "k.cu", [], [])
    try:
        nvrtc.compileProgram(prog, list(src.options) + ["--ptxas-options=-v"])
        log, cubin = nvrtc.getProgramLog(prog), nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    reported = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S))
    assert set(reported) == set(src.functions)
    assert cubin_registers_by_kernel(cubin) == {k: int(v) for k, v in reported.items()}


def test_compile_check_that_fails_leaves_the_output_as_it_was(tmp_path, monkeypatch):
    # the source was written before NVRTC ran: a failed --check replaced a working kernel with one that fails
    from maskc.codegen import emit

    def failing(src, *args, **kwargs):
        raise emit.KernelCompileError("NVRTC failed to compile maskc_fwd_causal: error: something")
    monkeypatch.setattr(emit, "compile_to_cubin", failing)
    out = tmp_path / "k.cu"
    out.write_text("// the kernel that worked\n")
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", out, "--check")
    assert result.exit_code == 1 and "NVRTC failed" in result.stderr, result.output
    assert out.read_text() == "// the kernel that worked\n"


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path, monkeypatch):
    # -o and --png wrote into the file itself: a full disk left half a kernel (or picture) in place of the old one
    import errno
    import pathlib

    import maskc.show

    def half_then_full(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    def png_half_then_full(classes, path, *args, **kwargs):
        pathlib.Path(path).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    out, png = tmp_path / "k.cu", tmp_path / "m.png"
    out.write_text("// the kernel that worked\n")
    png.write_bytes(b"the picture that was there")
    out.chmod(0o640)
    monkeypatch.setattr(pathlib.Path, "write_text", half_then_full)
    monkeypatch.setattr(maskc.show, "render_png", png_half_then_full)
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", out)
    assert result.exit_code == 1 and "No space left on device" in result.stderr, result.output
    result = invoke("show", EXAMPLES / "causal.mask", "--seq-len", 8, "--png", png)
    assert result.exit_code == 1 and "No space left on device" in result.stderr, result.output
    monkeypatch.undo()
    assert out.read_text() == "// the kernel that worked\n" and png.read_bytes() == b"the picture that was there"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cu", "m.png"]       # no temporary file left
    assert invoke("compile", EXAMPLES / "causal.mask", "-o", out).exit_code == 0
    assert "maskc_fwd_causal" in out.read_text() and out.stat().st_mode & 0o777 == 0o640   # its mode kept


def test_compile_rejects_impossible_tiles_cleanly(tmp_path):
    result = invoke("compile", EXAMPLES / "causal.mask", "-o", tmp_path / "k.cu", "--block-m", 96)
    assert result.exit_code == 1 and result.stderr.startswith("maskc: error: ") and "block_m 96" in result.stderr


@pytest.mark.parametrize("target", ["main.mask", "lib.mask", "link.mask"])
def test_outputs_never_overwrite_a_mask_file_they_read(tmp_path, target):
    # `-o causal.mask` (a slip for causal.cu) must not replace the user's mask, nor a file it imports, with CUDA
    (tmp_path / "lib.mask").write_text("mask window(w: int = 2)\n  allow k <= q, q - k < w\n")
    main = tmp_path / "main.mask"
    main.write_text('import "lib.mask"\n\nmask m()\n  allow window(3)\n')
    (tmp_path / "link.mask").symlink_to(main)
    before = {p.name: p.read_bytes() for p in (main, tmp_path / "lib.mask")}
    for command in (("compile", main, "-o", tmp_path / target),
                    ("show", main, "--seq-len", 8, "--png", tmp_path / target)):
        result = invoke(*command)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("maskc: error: ") and "would replace" in result.stderr
        assert {p.name: p.read_bytes() for p in (main, tmp_path / "lib.mask")} == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names of open descriptors: Linux's /proc")
def test_output_to_a_name_of_an_open_descriptor_goes_through_it(tmp_path):
    """`-o /dev/stdout >> all.cu` appends to all.cu (opening /dev/stdout anew truncated it): a name of one of the
    process's descriptors (/dev/stdout, /dev/fd/N, /proc/self/fd/N) is written through that descriptor, as the
    shell opened it; so is show's --png. A failed command writes nothing there; a regular file is still replaced
    whole."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    all_cu = tmp_path / "all.cu"
    all_cu.write_text("// kept\n")
    maskc_cmd = f"{sys.executable} -m maskc"
    script = (f"{maskc_cmd} compile {EXAMPLES / 'causal.mask'} -o /dev/stdout >> {all_cu} && "
              f"{maskc_cmd} compile {EXAMPLES / 'causal.mask'} -o /dev/fd/3 3>> {all_cu} && "
              f"{maskc_cmd} compile {EXAMPLES / 'causal.mask'} -o /proc/self/fd/1 --head-dim 64 >> {all_cu} && "
              f"{maskc_cmd} show {EXAMPLES / 'causal.mask'} --seq-len 256 --png /dev/stdout > {tmp_path / 'both'}; "
              f"{maskc_cmd} compile {EXAMPLES / 'causal.mask'} --block-m 7 -o /dev/stdout >> {all_cu}")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "Traceback" not in proc.stderr and proc.returncode == 1, proc.stderr     # the last one fails
    text = all_cu.read_text()
    assert text.startswith("// kept\n") and text.count("maskc_fwd_causal(") == 3, text[:200]
    both = (tmp_path / "both").read_bytes()
    assert both.startswith(b"mask causal") and both.count(b"\x89PNG") == 1
    replaced = tmp_path / "k.cu"
    replaced.write_text("old")
    assert invoke("compile", EXAMPLES / "causal.mask", "-o", replaced).exit_code == 0
    assert replaced.read_text().count("maskc_fwd_causal(") == 1


# -- run --------------------------------------------------------------------------------------

def test_parse_params_kinds_and_batches():
    mask = maskc.load(EXAMPLES / "hstu.mask")
    assert parse_params(mask, ("users=10,20", "context=2", "targets=1,2")) == {
        "users": [10, 20], "context": 2, "targets": [1, 2]}
    assert parse_params(mask, ("users=30;10,20",)) == {"users": [[30], [10, 20]]}
    assert parse_params(mask, ("context=1;2",)) == {"context": [1, 2]}


def test_run_on_cpu_says_so_and_compares_two_computations(no_gpu):
    result = invoke("run", EXAMPLES / "document.mask", "--seq-len", 512, "--param", "docs=100,200,212",
                    "--heads", 2)
    assert result.exit_code == 0, result.output
    assert "no GPU found: ran the CPU reference" in result.stdout
    assert "float64 dense reference:" in result.stdout and "float32 tile-skipping reference:" in result.stdout
    assert "█ FULL" in result.stdout and "tile classes: exact" in result.stdout
    assert "density:" in result.stdout
    err = float(re.search(r"‖ref‖ = ([0-9.e+-]+)", result.stdout).group(1))
    assert 0 < err < 1e-5          # not zero: two different computations; small: they agree


def test_run_backward_on_cpu(no_gpu):
    result = invoke("run", EXAMPLES / "hstu.mask", "--seq-len", 300, "--param", "users=100,200",
                    "--param", "targets=10,20", "--heads", 2, "--backward")
    assert result.exit_code == 0, result.output
    errors = {m.group(1): float(m.group(2)) for m in re.finditer(r"‖(d[qkv]) − ref‖ / ‖ref‖ = ([0-9.e+-]+)", result.stdout)}
    assert set(errors) == {"dq", "dk", "dv"} and all(0 < e < 1e-5 for e in errors.values()), result.stdout


def test_run_jagged_batch_on_cpu(no_gpu):
    result = invoke("run", EXAMPLES / "document.mask", "--seq-len", 256, "--param", "docs=100,156;256",
                    "--heads", 1)
    assert result.exit_code == 0, result.output
    assert "batch 2" in result.stdout


@pytest.mark.parametrize("command,param", [
    ("run", "window=1,2"), ("show", "window=1,2"), ("run", "window=1,2;3,4"), ("explain", "window=1,2"),
    ("run", "slope=0.5,0.25"),
])
def test_per_head_values_for_another_head_count_name_the_heads_flag(no_gpu, command, param):
    # bind says 'num_heads = 4'; on the command line that count is --heads (run's default 4, show's 1)
    example = "alibi.mask" if param.startswith("slope") else "per_head_window.mask"
    result = invoke(command, EXAMPLES / example, "--seq-len", 8, "--param", param)
    assert result.exit_code == 1, result.output
    assert "one per head, but num_heads = " in result.stderr
    assert "hint: num_heads is --heads on the command line: pass --heads 2" in result.stderr, result.stderr
    assert invoke(command, EXAMPLES / example, "--seq-len", 8, "--param", param, "--heads", 2).exit_code == 0


@pytest.mark.parametrize("command", ["run", "show", "explain", "compile"])
@pytest.mark.parametrize("param,flag", [("seq_len=2", "--seq-len"), ("kv_len=2", "--kv-len"),
                                        ("num_heads=2", "--heads")])
def test_a_length_given_as_a_param_names_its_flag(no_gpu, command, param, flag):
    # these reached bind twice, as its own argument and as a parameter: an internal error (TypeError)
    args = [] if command == "compile" else ["--seq-len", 8]
    result = invoke(command, EXAMPLES / "per_head_window.mask", *args, "--param", param)
    assert result.exit_code == 2 and "internal error" not in result.stderr, result.output
    assert f"{param.split('=')[0]} is not a parameter of the mask: give it with {flag}" in result.stderr


def test_segments_split_by_a_semicolon_hint_at_the_comma(no_gpu):
    # 'docs=100;156' is two batch elements of one document each: each sums short of seq_len
    result = invoke("show", EXAMPLES / "document.mask", "--seq-len", 256, "--param", "docs=100;156")
    assert result.exit_code == 1 and "sum to 100" in result.stderr
    assert "hint: ';' starts another batch element" in result.stderr and "separated by ','" in result.stderr


def test_run_on_cpu_takes_the_token_order(no_gpu, monkeypatch):
    """The tile-skipping pass runs in the order asked for (its tiles, q, k and v moved into it and the output
    back) and still agrees with the raster float64 reference; an order the mask does not admit is an error."""
    args = ("run", EXAMPLES / "clear.mask", "--seq-len", 1536, "--param", "width=32", "--param", "text=0",
            "--param", "radius=4", "--heads", 1, "--head-dim", 64)
    monkeypatch.setenv("MASKC_TOKEN_ORDER", "8x16")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "token order: patches of 8 x 16" in result.stdout and "): ok" in result.stdout
    monkeypatch.setenv("MASKC_TOKEN_ORDER", "8x17")
    result = invoke(*args)
    assert result.exit_code == 1 and "must divide the image's width 32" in result.stderr


def test_run_refuses_huge_cpu_runs(no_gpu):
    result = invoke("run", EXAMPLES / "causal.mask", "--seq-len", 16384)
    assert result.exit_code == 1
    assert "too large for the CPU reference (lengths at most 8192" in result.stderr


def test_blocked_reference_catches_a_wrong_tile(no_gpu):
    """The tile-skipping check really depends on the descriptor: corrupt one run and it disagrees."""
    bound = maskc.load(EXAMPLES / "causal.mask").bind(seq_len=256)
    rng = np.random.default_rng(1)
    q, k, v = (round_to(rng.standard_normal((1, 1, 256, 64), np.float32), "bf16") for _ in range(3))
    ref = maskc.reference_attention(q, k, v, bound)
    good = blocked_attention(q, k, v, bound, 64, 64)
    assert np.abs(good - ref).max() < 1e-5
    desc = bound.descriptor(64, 64)
    saved = desc.runs.copy()
    try:
        desc.runs[desc.runs[:, 2] == 1, 2] = 2          # pretend the diagonal tiles are FULL
        bad = blocked_attention(q, k, v, bound, 64, 64)
    finally:
        desc.runs[:] = saved
    assert np.abs(bad - ref).max() > 1e-2


def test_round_to_bf16_keeps_8_bits_of_mantissa():
    x = np.array([1.0 + 2 ** -9, 3.14159], np.float32)
    assert round_to(x, "bf16").tolist() == [1.0, 3.140625]
    assert (round_to(x, "fp16") == x.astype(np.float16)).all()


# -- lint -------------------------------------------------------------------------------------

def _warn_file(tmp_path):
    path = tmp_path / "w.mask"
    path.write_text("mask m(x: int)\n  allow k <= q\n  deny k > q\n")
    return path


def test_lint_text_warnings_exit_0_and_strict_exits_1(tmp_path):
    path = _warn_file(tmp_path)
    result = invoke("lint", path)
    assert result.exit_code == 0
    assert f"{path}:1:8: warning: parameter 'x' of mask 'm' is never used" in result.stdout
    assert f"{path}:3:3: warning: this deny rule removes nothing" in result.stdout
    assert invoke("lint", "--strict", path).exit_code == 1


def test_lint_errors_exit_1_and_examples_are_clean(bad_file):
    assert invoke("lint", *sorted(EXAMPLES.glob("*.mask"))).exit_code == 0
    result = invoke("lint", bad_file, EXAMPLES / "causal.mask")
    assert result.exit_code == 1
    assert f"{bad_file}:2:25: error: unknown name 'windw'" in result.stdout


def test_lint_json(tmp_path):
    result = invoke("lint", "--format", "json", _warn_file(tmp_path))
    items = json.loads(result.stdout)
    assert [(i["line"], i["col"], i["severity"]) for i in items] == [(1, 8, "warning"), (3, 3, "warning")]
    assert set(items[0]) == {"file", "line", "col", "end_col", "severity", "message", "hint"}
    assert items[0]["end_col"] == items[0]["col"] + len("x")


def test_lint_github(tmp_path, bad_file):
    result = invoke("lint", "--format", "github", bad_file)
    assert result.stdout.startswith(f"::error file={bad_file},line=2,col=25,endColumn=30::unknown name 'windw'")
    assert "::warning" in invoke("lint", "--format", "github", _warn_file(tmp_path)).stdout


# -- show and explain -------------------------------------------------------------------------

def test_show_counts_match_tiles_and_png_is_written(tmp_path):
    png = tmp_path / "m.png"
    result = invoke("show", EXAMPLES / "sliding_window.mask", "--seq-len", 1024, "--param", "window=200",
                    "--block-m", 64, "--block-n", 64, "--png", png)
    assert result.exit_code == 0, result.output
    classes = maskc.load(EXAMPLES / "sliding_window.mask").bind(seq_len=1024, window=200).tiles(64, 64)
    grid = "".join(line[1:-1] for line in result.stdout.splitlines() if line.startswith("│"))
    assert (grid.count("█"), grid.count("▒"), grid.count("·")) == (
        (classes == 2).sum(), (classes == 1).sum(), (classes == 0).sum())
    assert png.stat().st_size > 1000


def test_show_dense_small_and_refuses_large():
    result = invoke("show", EXAMPLES / "causal.mask", "--seq-len", 4, "--dense")
    assert result.exit_code == 0 and "│█···│\n│██··│\n│███·│\n│████│" in result.stdout
    result = invoke("show", EXAMPLES / "causal.mask", "--seq-len", 1000, "--dense")
    assert result.exit_code == 1 and "at most 160" in result.stderr
    assert result.stdout == ""          # refused before drawing the tiles, not after


@pytest.mark.parametrize("args", [("--seq-len", 2 ** 31 - 1),
                                  ("--seq-len", 2 ** 20, "--kv-len", 2 ** 31 - 1, "--block-m", 16, "--block-n", 1)])
def test_show_past_the_grid_cap_says_what_to_type(args):
    """A grid past 2**28 tiles is refused with command-line advice (on 5dc54e1 the API's: 'read the runs
    (run_offsets, runs, counts())'), and the command it suggests draws the mask."""
    result = invoke("show", EXAMPLES / "causal.mask", *args)
    assert result.exit_code == 1, result.output
    assert "past 268435456 (2**28)" in result.stderr and "run_offsets" not in result.stderr, result.stderr
    assert "Traceback" not in result.output
    sides = re.search(r"hint: draw larger tiles, e\.g\. --block-m (\d+) --block-n (\d+)", result.stderr)
    assert sides, result.stderr
    sizes = [a for i, a in enumerate(args) if "--block" not in str(a) and "--block" not in str(args[i - 1])]
    again = invoke("show", EXAMPLES / "causal.mask", *sizes, "--block-m", sides[1], "--block-n", sides[2])
    assert again.exit_code == 0, again.output
    assert "PARTIAL" in again.stdout


def test_explain_prints_every_stage_and_bound_tiles():
    result = invoke("explain", EXAMPLES / "prefix_lm.mask", "--seq-len", 512, "--param", "prefix=100")
    assert result.exit_code == 0, result.output
    stages = ("parse", "resolve", "normalize", "ranges", "bind", "classify", "pack", "predicate", "schedule", "emit")
    positions = [result.stdout.index(f"== {stage}:") for stage in stages]
    assert positions == sorted(positions)
    assert "allow [0] -prefix + k + 1 <= 0" in result.stdout
    assert "row block 0:" in result.stdout


# -- issue 18: defaults, help, version, cache, status line -------------------------------------------

@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.mask")), ids=lambda p: p.name)
def test_compile_needs_no_flags_on_any_example(path, tmp_path):
    result = invoke("compile", path, "-o", tmp_path / "k.cu")
    assert result.exit_code == 0, result.output
    assert "head_dim 128, bf16" in result.stderr                  # run's defaults too
    assert 'extern "C" __global__' in (tmp_path / "k.cu").read_text()


def test_compile_and_run_share_their_defaults():
    from maskc.cli_shared import DEFAULT_DTYPE, DEFAULT_HEAD_DIM

    def defaults(command):
        return {p.name: p.default for p in command.params if p.name in ("head_dim", "dtype")}
    assert defaults(cli.commands["compile"]) == defaults(cli.commands["run"]) == {
        "head_dim": str(DEFAULT_HEAD_DIM), "dtype": DEFAULT_DTYPE}


def test_every_help_shows_an_example():
    commands = [[]] + [[name] for name in cli.commands] + [["cache", sub] for sub in cli.commands["cache"].commands]
    for command in commands:
        result = invoke(*command, "--help")
        assert result.exit_code == 0 and "Example" in result.stdout and "maskc " in result.stdout, command


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"maskc {maskc.__version__}"


def test_run_exits_1_when_the_result_disagrees(no_gpu, monkeypatch):
    args = ("run", EXAMPLES / "causal.mask", "--seq-len", 64, "--heads", 1, "--head-dim", 64)
    assert invoke(*args).exit_code == 0
    wrong = lambda q, k, v, bound, bm, bn: blocked_attention(q, k, v, bound, bm, bn) * 1.01  # noqa: E731
    monkeypatch.setattr("maskc.runtime.cpu_check.blocked_attention", wrong)
    result = invoke(*args)
    assert result.exit_code == 1 and "MISMATCH" in result.stdout
    assert "differs from the float64 reference" in result.stderr


def test_run_refuses_a_nan_tolerance(no_gpu):
    # click's FloatRange lets nan through, and every result then failed as a MISMATCH (tolerance nan)
    result = invoke("run", EXAMPLES / "causal.mask", "--seq-len", 8, "--heads", 1, "--tolerance", "nan")
    assert result.exit_code == 2 and "nan is not a tolerance" in result.stderr, result.output


def test_cache_info_and_clear_touch_only_maskcs_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKC_CACHE_DIR", str(tmp_path))
    (tmp_path / "maskc_fwd_causal-0123.cubin").write_bytes(b"\0" * 2048)
    (tmp_path / "autotune.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("the user's")
    info = invoke("cache", "info")
    assert info.exit_code == 0 and str(tmp_path) in info.stdout
    assert "compiled kernels: 1 cubin(s), 2.0 KiB" in info.stdout and "autotuning results: yes" in info.stdout
    cleared = invoke("cache", "clear")
    assert cleared.exit_code == 0 and "removed 2 file(s)" in cleared.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_status_line_only_on_a_terminal_and_only_when_slow():
    import io
    import time
    from maskc.progress import status

    quiet = io.StringIO()
    with status("compiling", stream=quiet, delay=0.0, interval=0.01):     # not a terminal: nothing
        time.sleep(0.05)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    with status("compiling", stream=shown, delay=0.0, interval=0.01, enabled=True):
        time.sleep(0.05)
    assert "maskc: compiling (0 s)" in shown.getvalue() and shown.getvalue().endswith("\r\033[K")
    fast = io.StringIO()
    with status("compiling", stream=fast, delay=5.0, enabled=True):      # done before the delay
        pass
    assert fast.getvalue() == ""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_120a", "compute_80", "compute_87", "compute_100",
                                  "sm_99", "sm_90", "compute_75", "compute_90a", "hopper", "compute_99", "compute_121"])
def test_compile_arch_takes_what_options_takes(arch):
    """`maskc compile --arch` accepts exactly the targets Options(arch=...) accepts (it once offered ARCHES and
    compute_80 only); a refused one is a usage error (exit 2) carrying Options' message."""
    try:
        Options(arch=arch)
        accepted = True
    except ValueError:
        accepted = False
    result = invoke("compile", EXAMPLES / "causal.mask", "--arch", arch)
    if accepted:
        assert result.exit_code == 0 and "maskc_fwd_causal" in result.stdout, result.stderr
    else:
        assert result.exit_code == 2 and f"target '{arch}' unsupported" in result.stderr
