"""Where the package's data lives: beside ``maskc/`` in a checkout, inside it in an installed wheel."""
from __future__ import annotations

import functools
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """The folder ``grammars``, ``templates`` or ``examples``."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"maskc is missing its {name}/ folder (looked in {_PACKAGE} and its parent)")


def grammar_text() -> str:
    return (data_dir("grammars") / "mask.lark").read_text(encoding="utf-8")
