"""The documentation's examples are run: every fenced block of docs/ and README.md that the docs mark as
checked (see docs/README.md, "How the examples are checked").

- ```mask [file=NAME.mask] [error]```: compiles (with ``error``: fails with a MaskError); ``file=`` also
  writes it into the page's directory, so later blocks can import it or pass it to a command.
- ```visible seq_len=N [kv_len=N] [mask=NAME] [num_heads=H] [head=I] [batch=I] [PARAM=VALUE ...]```: the
  visible pairs of the mask block above, one row per query, ``x`` visible, ``.`` hidden, drawn by hand:
  checked against ``bound.dense()``.
- ```console [exit=N]```: each ``$ maskc ...`` line runs (no GPU, an empty cache) and exits with N (0);
  each line shown under it must appear in its output, ``...`` standing for any text.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import maskc
from maskc import cli_run
from maskc.cli import cli, parse_params

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)


def _blocks(page: Path):
    """(lang, attributes, body, line) of each fenced block."""
    text = page.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        lang, *attrs = m.group(1).split() or [""]
        yield lang, dict(a.partition("=")[::2] for a in attrs), m.group(2), text[:m.start()].count("\n") + 1


def _check_visible(mask_text: str, attrs: dict, body: str, where: str, base: Path) -> None:
    expected = np.array([[c == "x" for c in row.strip()] for row in body.strip().splitlines()])
    args = dict(attrs)
    name = args.pop("mask", None)
    head, element = int(args.pop("head", 0)), int(args.pop("batch", 0))
    sizes = {key: int(args.pop(key)) for key in ("seq_len", "kv_len", "num_heads") if key in args}
    mask = maskc.compile_mask(mask_text, name, path=str(base / "example.mask"), base_dir=base)
    values = parse_params(mask, tuple(f"{k}={v}" for k, v in args.items()))     # as --param reads them
    dense = mask.bind(**sizes, **values).dense(element, head)
    assert dense.shape == expected.shape, f"{where}: the picture is {expected.shape}, the mask {dense.shape}"
    assert (dense == expected).all(), f"{where}: maskc shows\n" + "\n".join(
        "".join("x" if v else "." for v in row) for row in dense)


def _check_console(body: str, attrs: dict, where: str) -> None:
    expected_exit = int(attrs.get("exit", 0))
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif line.strip() and commands:
            commands[-1][1].append(line.rstrip())
    assert commands, f"{where}: a console block without a '$ ' command"
    for command, shown in commands:
        argv = shlex.split(command)
        assert argv[0] == "maskc", f"{where}: only maskc commands are run: {command}"
        result = CliRunner().invoke(cli, argv[1:])
        output = result.output
        assert result.exit_code == expected_exit, f"{where}: `{command}` exited {result.exit_code}\n{output}"
        assert "Traceback" not in output
        for line in shown:
            pattern = ".*".join(re.escape(part) for part in line.strip().split("..."))
            assert re.search(pattern, output), f"{where}: `{command}` did not print\n  {line}\nbut\n{output}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_run, "gpu_available", lambda: False)
    monkeypatch.setenv("MASKC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    last_mask = None
    checked = 0
    for lang, attrs, body, line in _blocks(page):
        where = f"{page.relative_to(ROOT)}:{line}"
        if lang == "mask":
            if "file" in attrs:
                (tmp_path / attrs["file"]).write_text(body)
            if "error" in attrs:
                with pytest.raises(maskc.MaskError):
                    maskc.compile_mask(body, path=str(tmp_path / "example.mask"), base_dir=tmp_path)
                last_mask = None
            else:
                for name in re.findall(r"^mask\s+(\w+)", body, re.M):
                    maskc.compile_mask(body, name, path=str(tmp_path / "example.mask"), base_dir=tmp_path)
                last_mask = body
        elif lang == "visible":
            assert last_mask is not None, f"{where}: a visible block needs a mask block above it"
            _check_visible(last_mask, attrs, body, where, tmp_path)
        elif lang == "console":
            _check_console(body, attrs, where)
        else:
            continue
        checked += 1
    if page.parent.name in ("commands", "language"):
        assert checked, f"{page.relative_to(ROOT)} has no checked example"


def test_every_command_and_construct_has_a_page():
    commands = {p.stem for p in (ROOT / "docs" / "commands").glob("*.md")}
    assert set(cli.commands) <= commands, set(cli.commands) - commands
    language = (ROOT / "docs" / "language").glob("*.md")
    text = "\n".join(p.read_text() for p in language)
    constructs = ["mask", "allow", "deny", "require", "let", "import", "int", "const int", "segments", "per",
                  "same(", ".start(", ".end(", ".length(", ".index(", "seq_len", "kv_len", "clamp(", "abs(",
                  "min(", "max(", "**", "//", "%", " in [", " not ", " or ", " and ", "true", "false"]
    missing = [c for c in constructs if c not in text]
    assert not missing, missing


def test_readme_documents_every_environment_variable():
    used = set()
    for path in list((ROOT / "maskc").glob("*.py")) + [ROOT / "tests" / "conftest.py"]:
        used |= set(re.findall(r"MASKC_[A-Z_0-9]+", path.read_text()))
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Options and environment variables"):]
    missing = sorted(v for v in used if f"`{v}" not in section)
    assert not missing, f"README's environment variables section does not describe {missing}"
    # its table: each variable Options reads on the row of the field it sets, and no variable it does not read
    from maskc.options import ENVIRONMENT
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(MASKC_[A-Z_0-9]+)[^`]*` \| *`?(\w*)`? *\|", section, re.M)}
    assert {v: f for v, f in rows.items() if f} == ENVIRONMENT
    assert set(rows) - set(ENVIRONMENT) == {"MASKC_HYPOTHESIS"}     # the test suite's, not an option


# -- the pages against the CLI: what `--help` and the code say, the docs say too --------------------------------

def _spelled(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _options(command) -> list[tuple[str, ...]]:
    import click
    return [tuple(p.opts) for p in command.params if isinstance(p, click.Option)]


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_each_pages_synopsis_lists_every_option_of_its_command(name):
    page = (ROOT / "docs" / "commands" / f"{name}.md").read_text()
    synopsis = page.split("\n\n")[1]            # the indented block under the title
    missing = [o for o in _options(cli.commands[name]) if not any(_spelled(synopsis, s) for s in o)]
    assert not missing, f"docs/commands/{name}.md's synopsis does not list {missing}"


def test_readmes_cli_section_lists_every_compile_option():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## CLI"):].split("\n## ")[0]
    missing = [o for o in _options(cli.commands["compile"]) if not any(_spelled(section, s) for s in o)]
    assert not missing, f"README's CLI section does not list compile's {missing}"


def test_the_cache_pages_name_every_variable_that_places_the_cache():
    import inspect

    from maskc.runtime import cache
    read = set(re.findall(r'env\.get\("(\w+)"', inspect.getsource(cache.location))) - {"HOME"}    # ~ says HOME
    assert {"MASKC_CACHE_DIR", "XDG_CACHE_HOME"} <= read
    readme = (ROOT / "README.md").read_text()
    pages = {"README.md": readme[readme.index("## The cache"):].split("\n## ")[0],
             "docs/commands/cache.md": (ROOT / "docs" / "commands" / "cache.md").read_text(),
             "maskc cache --help": CliRunner().invoke(cli, ["cache", "--help"]).output}
    for where, text in pages.items():
        assert not [v for v in read if f"${v}" not in text], f"{where} does not say where the cache lives"


def test_explains_page_lists_the_stages_it_prints_in_order(monkeypatch):
    monkeypatch.setattr(cli_run, "gpu_available", lambda: False)
    result = CliRunner().invoke(cli, ["explain", str(ROOT / "examples" / "prefix_lm.mask"), "--seq-len", "256",
                                      "--param", "prefix=100"])
    assert result.exit_code == 0, result.output
    printed = list(dict.fromkeys(re.findall(r"^== ([\w ]+):", result.output, re.MULTILINE)))
    page = (ROOT / "docs" / "commands" / "explain.md").read_text()
    listed = re.findall(r"\*\*([\w ]+)\*\*", page.split("```")[0])
    assert listed == printed


def test_lints_help_says_which_tiles_are_not_exact_as_its_page_does():
    helptext = " ".join(CliRunner().invoke(cli, ["lint", "--help"]).output.split())
    page = " ".join((ROOT / "docs" / "commands" / "lint.md").read_text().split())
    for text in (helptext, page):                   # k through // and % is not linear, and exact
        assert "not linear" not in text and re.search(r"`?//`? and `?%`?[^.;]* exact", text), text
