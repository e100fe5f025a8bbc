"""maskc.options: one Options value for every choice of how kernels are built and run, the MASKC_* environment
read in one place (Options.from_environment), the CLI taking it (the torch ops: tests/test_torch_ops.py), and a
kernel cache key that depends on options only through the kernel they decide (never on a host path)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import maskc
from maskc.cli import cli
from maskc.options import DEFAULT, ENVIRONMENT, Options, from_token
from maskc.codegen.schedule import Tiles
from conftest import EXAMPLES, ROOT

# (variable, value, field, the field's value)
SETTINGS = [
    ("MASKC_ENGINE", "mma", "engine", "mma"),
    ("MASKC_AUTOTUNE", "1", "autotune", True),
    ("MASKC_BWD_ENGINE", "wgmma", "backward_engine", "wgmma"),
    ("MASKC_BWD_DQ_REDUCTION", "red2", "dq_reduction", "red2"),
    ("MASKC_WGMMA_OVERLAP", "0", "overlap", False),
    ("MASKC_WGMMA_PINGPONG", "0", "pingpong", False),
    ("MASKC_DEBUG_WAITS", "1", "debug_waits", True),
    ("MASKC_SYNC", "1", "sync", True),
    ("MASKC_CACHE_DIR", "/tmp/maskc-elsewhere", "cache_dir", "/tmp/maskc-elsewhere"),
    ("MASKC_ARCH", "compute_80", "arch", "compute_80"),
    ("MASKC_MAX_DESCRIPTOR_BYTES", "4096", "max_descriptor_bytes", 4096),
    ("MASKC_TOKEN_ORDER", "8x16", "token_order", "8x16"),
    ("MASKC_PARTIAL_TILES", "elements", "partial_tiles", "elements"),
    ("MASKC_EXP2_EMULATION", "4", "exp2_emulation", 4),
    ("MASKC_DQ_TURN_ORDER", "wave", "dq_turn_order", "wave"),
    ("MASKC_DETERMINISTIC_DQ", "kernel", "deterministic_dq", "kernel"),
    ("MASKC_LONG_ROWS_FIRST", "0", "long_rows_first", False),
]


def test_every_variable_is_covered_here():
    assert {s[0] for s in SETTINGS} == set(ENVIRONMENT)


@pytest.mark.parametrize("variable,value,field,expected", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_each_variable_sets_its_field_and_nothing_else(variable, value, field, expected):
    options = Options.from_environment({variable: value, "UNRELATED": "x"})
    assert getattr(options, field) == expected
    assert options == DEFAULT.replace(**{field: expected})
    assert Options.from_environment({variable: ""}) == DEFAULT      # empty: unset


def test_no_environment_is_the_defaults():
    assert Options.from_environment({}) == Options() == DEFAULT
    assert DEFAULT.cache_path == Path.home() / ".cache" / "maskc"
    assert repr(DEFAULT) == "Options()" and repr(Options(sync=True, engine="mma")) == "Options(engine='mma', sync=True)"


@pytest.mark.parametrize("word,value", [("1", True), ("true", True), ("Yes", True), ("on", True), ("0", False),
                                        ("false", False), ("NO", False), ("off", False)])
def test_switches_read_the_usual_words(word, value):
    assert Options.from_environment({"MASKC_SYNC": word}).sync is value


@pytest.mark.parametrize("variable,value", [("MASKC_ENGINE", "tensor-cores"), ("MASKC_ENGINE", "wgmma"),
                                            ("MASKC_BWD_DQ_REDUCTION", "none"), ("MASKC_SYNC", "maybe"),
                                            ("MASKC_ARCH", "sm90"), ("MASKC_ARCH", "sm_99"), ("MASKC_BWD_ENGINE", "tma"),
                                            ("MASKC_MAX_DESCRIPTOR_BYTES", "1GiB"), ("MASKC_MAX_DESCRIPTOR_BYTES", "0"),
                                            ("MASKC_TOKEN_ORDER", "patches"), ("MASKC_EXP2_EMULATION", "3"),
                                            ("MASKC_EXP2_EMULATION", "half"), ("MASKC_DETERMINISTIC_DQ", "own")])
def test_a_bad_value_is_an_error_that_names_the_variable(variable, value):
    others = {"MASKC_SYNC": "1"} if variable != "MASKC_SYNC" else {}    # a good one beside it is not blamed
    with pytest.raises(ValueError, match=f"^{variable}={value!r}: "):
        Options.from_environment({variable: value, **others})


def test_values_are_checked_when_made():
    assert Options(tiles=(128, 64, 4)).tiles == Tiles(128, 64, 4, "mma")
    assert Options(cache_dir=Path("/x")).cache_dir == "/x"
    for bad in (dict(tiles=(128, 64)), dict(tiles=(128, 0, 4)), dict(tiles=(128, 64, 4, "tensor")),
                dict(tiles=(128, 64, 4), autotune=True), dict(engine="wgmma"), dict(arch="hopper"),
                dict(max_descriptor_bytes=0), dict(max_descriptor_bytes="1024"), dict(max_descriptor_bytes=True),
                dict(exp2_emulation=3), dict(exp2_emulation=True), dict(exp2_emulation="2")):
        with pytest.raises(ValueError):
            Options(**bad)


@pytest.mark.parametrize("arch", ["sm_99", "sm_90", "sm_75", "compute_75", "compute_90a", "compute_8", "hopper", 90,
                                  "compute_99", "compute_95", "compute_101", "compute_1000"])
def test_a_target_maskc_does_not_build_for_is_refused_when_made(arch):
    """Options(arch=...) and MASKC_ARCH take schedule.ARCHES or compute_XY (PTX_CAPABILITIES) and refuse any other target
    then, listing the ones they take, rather than leaving it to NVRTC (or to a kernel built for sm_99 as mma)."""
    from maskc.codegen.schedule import ARCHES

    with pytest.raises(ValueError, match=f"^target {re.escape(repr(arch))} unsupported: maskc builds for "
                                         f"{', '.join(ARCHES)}, or compute_XY") as err:
        Options(arch=arch)
    assert "compute_80" in str(err.value)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a", "compute_80",
                                  "compute_87", "compute_100"])
def test_every_target_maskc_builds_for_is_taken(arch):
    assert Options(arch=arch).arch == Options.from_environment({"MASKC_ARCH": arch}).arch == arch


@pytest.mark.parametrize("options", [DEFAULT, Options(tiles=(64, 32, 4, "mma"), sync=True),
                                     Options(engine="wgmma_tma", overlap=False, cache_dir="/c", arch="sm_90a"),
                                     Options(backward_engine="mma", dq_reduction="red2", autotune=True),
                                     Options(max_descriptor_bytes=1 << 33)])
def test_token_round_trips(options):
    assert isinstance(options.token, str) and from_token(options.token) == options
    assert hash(from_token(options.token)) == hash(options)


def test_empty_token_reads_the_environment_when_used(monkeypatch):
    monkeypatch.setenv("MASKC_ENGINE", "mma")
    assert from_token("") == Options(engine="mma")
    monkeypatch.setenv("MASKC_ENGINE", "wgmma_tma")     # read again on the next use, not remembered
    assert from_token("") == Options(engine="wgmma_tma")
    monkeypatch.delenv("MASKC_ENGINE")
    assert from_token("") == DEFAULT


def test_the_environment_is_read_in_one_module():
    """No maskc module but options.py reads a MASKC_ variable (emit.py reads CUDA_PATH/CUDA_HOME, where the
    CUDA toolkit's headers are: not a maskc option)."""
    readers = {}
    for path in (ROOT / "maskc").rglob("*.py"):
        text = path.read_text()
        if re.search(r"os\.environ|getenv", text):
            readers[path.name] = sorted(set(re.findall(r"(?:environ(?:\.get)?[\[(]|getenv\()\s*\"?(\w+)", text)))
    assert set(readers) <= {"options.py", "emit.py"}, readers
    assert all(not v.startswith("MASKC_") for v in readers.get("emit.py", [])), readers


# -- the CLI starts from the environment; its flags override it ----------------------------------------------

def _compile(tmp_path, env, *flags):
    out = tmp_path / "k.cu"
    result = CliRunner().invoke(cli, ["compile", str(EXAMPLES / "causal.mask"), "-o", str(out), *flags], env=env)
    return result, out.read_text() if out.is_file() else None


def test_compile_takes_the_environment_and_its_flags_win(tmp_path):
    causal = maskc.load(EXAMPLES / "causal.mask")
    result, source = _compile(tmp_path, {"MASKC_ENGINE": "mma"})
    assert result.exit_code == 0 and source == causal.kernel_source(engine="mma").source
    result, source = _compile(tmp_path, {"MASKC_ENGINE": "mma"}, "--engine", "wgmma_tma")
    assert result.exit_code == 0 and source == causal.kernel_source(engine="wgmma_tma").source
    result, source = _compile(tmp_path, {"MASKC_WGMMA_PINGPONG": "0"})
    assert source == causal.kernel_source(Options(pingpong=False)).source != causal.kernel_source().source
    result, source = _compile(tmp_path, {"MASKC_ARCH": "sm_80"})
    assert source == causal.kernel_source(arch="sm_80").source
    result, _ = _compile(tmp_path, {"MASKC_BWD_DQ_REDUCTION": "red2"}, "--backward")
    assert result.exit_code == 0
    assert (tmp_path / "k.cu").read_text() == causal.backward_source(dq_reduction="red2").source


@pytest.mark.parametrize("variable,value", [("MASKC_ENGINE", "tensor-cores"), ("MASKC_ARCH", "sm_99")])
def test_a_bad_variable_is_a_cli_error(tmp_path, variable, value):
    result, source = _compile(tmp_path, {variable: value})
    assert result.exit_code == 1 and f"{variable}={value!r}" in result.output and source is None
    assert "Traceback" not in result.output and "internal error" not in result.output


# -- the cache key ------------------------------------------------------------------------------------------

def test_cache_key_is_the_kernel_not_where_things_lie(tmp_path):
    """The same mask from two directories, with two include paths, renders the same kernel and one key; a
    switch that changes the kernel changes the key."""
    pytest.importorskip("cupy")
    import dataclasses

    from maskc.runtime.loader import kernel_key
    keys, sources = set(), set()
    for where in ("a", "b/c"):
        folder = tmp_path / where
        folder.mkdir(parents=True)
        shutil.copy(EXAMPLES / "document.mask", folder / "document.mask")
        src = maskc.load(folder / "document.mask").kernel_source()
        options = tuple(o if not o.startswith("-I") else f"-I{folder}" for o in src.options)
        src = dataclasses.replace(src, options=options)
        keys.add(kernel_key(src))
        sources.add(src.source)
        assert str(tmp_path) not in src.source
    assert len(keys) == len(sources) == 1
    other = maskc.load(EXAMPLES / "document.mask").kernel_source(Options(overlap=False))
    assert kernel_key(other) not in keys


def test_public_functions_refuse_what_is_not_options():
    """Every public function that takes ``options`` says what it takes (a TypeError naming Options) when given
    something else (a token order's string, a dict), instead of an AttributeError from deep inside."""
    torch = pytest.importorskip("torch")
    mask = maskc.load(EXAMPLES / "causal.mask")
    bound = mask.bind(seq_len=64)
    q = torch.zeros(1, 1, 64, 16)
    calls = {
        "maskc.attention": lambda o: maskc.attention(q, q, q, bound, options=o),
        "maskc.attention_backward": lambda o: maskc.attention_backward(q, q, q, q, q, q[..., 0], bound, options=o),
        "torch_ops.attention": lambda o: __import__("maskc.runtime.torch_ops", fromlist=["attention"]).attention(
            q, q, q, bound, options=o),
        "CompiledMask.kernel_source": lambda o: mask.kernel_source(o),
        "CompiledMask.backward_source": lambda o: mask.backward_source(o),
    }
    for name, call in calls.items():
        for bad in ("raster", {"engine": "mma"}):
            with pytest.raises(TypeError, match=r"maskc\.Options") as err:
                call(bad)
            assert type(bad).__name__ in str(err.value), name
