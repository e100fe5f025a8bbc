"""The CUDA templates repeat no code: a block of WINDOW or more lines that appears twice, in two templates or in one,
belongs in one place (an include, a macro, or a device function of device_common.cu.j2).

Lines are compared stripped of indentation; blank lines and lines of braces alone do not count, so a block
cannot hide behind re-indentation or a blank line, and two functions that merely both end in `}` do not match.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from maskc.codegen.emit import template_dir

WINDOW = 6
_TRIVIAL = {"", "{", "}", "};"}


def repeated_blocks(texts: dict[str, str], window: int = WINDOW) -> list[list[tuple[str, int]]]:
    """Every block of ``window`` significant lines that occurs more than once in ``texts`` (name -> text), as the
    list of its (name, first line number) occurrences; overlapping windows of one longer block each count."""
    places: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for name, text in texts.items():
        lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)]
        lines = [(number, line) for number, line in lines if line not in _TRIVIAL]
        for i in range(len(lines) - window + 1):
            places[tuple(line for _, line in lines[i:i + window])].append((name, lines[i][0]))
    return [where for where in places.values() if len(where) > 1]


def test_the_finder_finds_a_repeat_across_files_and_within_one():
    block = "\n".join(f"    step_{i}();" for i in range(WINDOW))
    texts = {"a.cu.j2": f"int a;\n{block}\n}}\n", "b.cu.j2": f"int b;\n\n{block.replace('    ', '  ')}\n",
             "c.cu.j2": f"{block}\nint c;\n{block}\n"}
    found = repeated_blocks(texts)
    assert [sorted(where) for where in found] == [[("a.cu.j2", 2), ("b.cu.j2", 3), ("c.cu.j2", 1), ("c.cu.j2", 8)]]
    shorter = "\n".join(f"step_{i}();" for i in range(WINDOW - 1))
    assert repeated_blocks({"a": f"{shorter}\nx();", "b": f"{shorter}\ny();"}) == []


def test_no_block_is_repeated_between_or_within_templates():
    texts = {path.name: path.read_text() for path in sorted(Path(template_dir()).glob("*.j2"))}
    assert len(texts) > 10
    repeats = repeated_blocks(texts)
    assert not repeats, "blocks repeated in templates/ (first lines): " + "; ".join(
        ", ".join(f"{name}:{line}" for name, line in where) for where in repeats)
