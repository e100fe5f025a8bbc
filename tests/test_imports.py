"""Imports stay in their sandbox (issue 17, item 2): the importing file's directory or an explicit search
path, never outside; regular .mask files only, of bounded size; errors name paths, never another file's
content."""
import os

import numpy as np
import pytest
from click.testing import CliRunner

import maskc
from maskc.cli import cli
from maskc.errors import MaskError
from maskc.frontend.sources import MAX_SOURCE_BYTES
from maskc.lint import lint_file

SECRET = "TOPSECRET_do_not_print_me"
CAUSAL = "mask causal()\n  allow k <= q\n"


@pytest.fixture
def sandbox(tmp_path):
    """tmp/outside/secret.mask (and .txt) with a secret in it; tmp/proj/ where the main file lives."""
    outside, proj = tmp_path / "outside", tmp_path / "proj"
    outside.mkdir()
    proj.mkdir()
    for name in ("secret.mask", "secret.txt"):
        (outside / name).write_text(f"{SECRET} is not a mask\n")
    return proj, outside


def load_main(proj, imp: str, **kw):
    (proj / "main.mask").write_text(f'import "{imp}"\nmask m()\n  allow k <= q\n')
    return maskc.load(proj / "main.mask", **kw)


def refused(proj, imp: str, match: str | None, **kw) -> MaskError:
    with pytest.raises(MaskError, match=match) as info:
        load_main(proj, imp, **kw)
    text = str(info.value)
    assert SECRET not in text and "is not a mask" not in text
    assert info.value.span is not None and info.value.span.line == 1, text
    return info.value


def test_absolute_path_is_refused(sandbox):
    proj, outside = sandbox
    refused(proj, str(outside / "secret.mask"), "not an absolute one")


def test_dotdot_escape_is_refused(sandbox):
    proj, _ = sandbox
    refused(proj, "../outside/secret.mask", r"'\.\.' would leave")
    refused(proj, "lib/../../outside/secret.mask", r"'\.\.' would leave")


def test_proc_environ_is_refused(sandbox, monkeypatch):
    proj, _ = sandbox
    monkeypatch.setenv("MASKC_TEST_SECRET", SECRET)
    refused(proj, "/proc/self/environ", "not an absolute one")


def test_symlink_to_a_file_outside_is_refused(sandbox):
    proj, outside = sandbox
    os.symlink(outside / "secret.mask", proj / "link.mask")
    refused(proj, "link.mask", "symlink to a file outside")


def test_symlinked_directory_outside_is_refused(sandbox):
    proj, outside = sandbox
    os.symlink(outside, proj / "lib")
    refused(proj, "lib/secret.mask", "symlink to a file outside")


def test_symlink_inside_the_directory_is_followed(sandbox):
    proj, _ = sandbox
    (proj / "real.mask").write_text(CAUSAL)
    os.symlink(proj / "real.mask", proj / "alias.mask")
    (proj / "main.mask").write_text('import "alias.mask"\nmask m()\n  allow causal()\n')
    assert maskc.load(proj / "main.mask").bind(4).dense().sum() == 10


def test_only_mask_files_are_imported(sandbox):
    proj, _ = sandbox
    (proj / "notes.txt").write_text(f"{SECRET}\n")
    refused(proj, "notes.txt", "only .mask files")


def test_fifo_and_directory_are_refused_without_blocking(sandbox):
    proj, _ = sandbox
    os.mkfifo(proj / "pipe.mask")
    refused(proj, "pipe.mask", "not a regular file")
    (proj / "dir.mask").mkdir()
    refused(proj, "dir.mask", "not a regular file|Is a directory")


def test_oversized_import_is_refused(sandbox):
    proj, _ = sandbox
    (proj / "big.mask").write_text(CAUSAL + "#" * MAX_SOURCE_BYTES + "\n")
    refused(proj, "big.mask", "larger than")


@pytest.mark.parametrize("name", ["a\x00b.mask", "x" * 300 + ".mask", "d/" * 2100 + "x.mask", "", "\x1b[2J.mask"])
def test_bad_names_are_located_errors(sandbox, name):
    """NUL raised ValueError and a long name OSError on main; both are now errors at the import."""
    proj, _ = sandbox
    refused(proj, name, "cannot import|an import names a file")


def test_search_path_is_used_after_the_files_directory(sandbox, tmp_path):
    proj, _ = sandbox
    lib = tmp_path / "lib"
    (lib / "sub").mkdir(parents=True)
    (lib / "sub" / "base.mask").write_text(CAUSAL)
    (lib / "mid.mask").write_text('import "sub/base.mask"\nmask mid()\n  allow causal(), k >= 1\n')
    (proj / "main.mask").write_text('import "mid.mask"\nmask m()\n  allow mid()\n')
    with pytest.raises(MaskError, match="no such file"):
        maskc.load(proj / "main.mask")
    d = maskc.load(proj / "main.mask", import_paths=[lib]).bind(5).dense()
    q, k = np.indices((5, 5))
    assert np.array_equal(d, (k <= q) & (k >= 1))
    text = (proj / "main.mask").read_text()
    assert maskc.compile_mask(text, base_dir=proj, import_paths=(lib,)).bind(5).dense().sum() == d.sum()


@pytest.mark.parametrize("as_one", [str, lambda p: p])
def test_one_search_directory_may_be_given_alone(sandbox, tmp_path, as_one):
    # import_paths="lib" was read as the directories 'l', 'i', 'b' (and a Path was a TypeError)
    proj, _ = sandbox
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.mask").write_text(CAUSAL)
    (proj / "main.mask").write_text('import "base.mask"\nmask m()\n  allow causal()\n')
    assert maskc.load(proj / "main.mask", import_paths=as_one(tmp_path / "lib")).bind(4).dense().sum() == 10
    text = (proj / "main.mask").read_text()
    assert maskc.compile_mask(text, base_dir=proj, import_paths=as_one(tmp_path / "lib")).bind(4).dense().sum() == 10
    assert [d for d in lint_file(proj / "main.mask", as_one(tmp_path / "lib")) if d.severity == "error"] == []


def test_search_path_does_not_allow_escapes(sandbox, tmp_path):
    proj, outside = sandbox
    lib = tmp_path / "lib"
    lib.mkdir()
    os.symlink(outside / "secret.mask", lib / "s.mask")
    refused(proj, "s.mask", "symlink to a file outside", import_paths=[lib])


def test_search_path_must_be_a_directory(sandbox, tmp_path):
    proj, _ = sandbox
    with pytest.raises(MaskError, match="not a directory"):
        load_main(proj, "x.mask", import_paths=[tmp_path / "nope"])


def test_cli_import_path_flag(sandbox, tmp_path):
    proj, outside = sandbox
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "base.mask").write_text(CAUSAL)
    (proj / "main.mask").write_text('import "base.mask"\nmask m()\n  allow causal()\n')
    runner = CliRunner()
    main = str(proj / "main.mask")
    assert runner.invoke(cli, ["show", main, "--seq-len", "4"]).exit_code == 1
    for args in (["show", main, "--seq-len", "4"], ["compile", main, "-o", str(tmp_path / "k.cu")],
                 ["explain", main], ["lint", main], ["run", main, "--seq-len", "8", "--heads", "1"]):
        result = runner.invoke(cli, args + ["--import-path", str(lib)])
        assert result.exit_code == 0, (args, result.output)
    (proj / "evil.mask").write_text(f'import "{outside / "secret.mask"}"\nmask m()\n  allow k <= q\n')
    result = runner.invoke(cli, ["compile", str(proj / "evil.mask")])
    assert result.exit_code == 1 and SECRET not in result.output and "Traceback" not in result.output
