"""Making user text safe to place in generated CUDA: identifiers and comments."""
from __future__ import annotations

import re

_C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum extern float for
goto if inline int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while bool true false class namespace template typename this new delete""".split())


def c_identifier(name: str) -> str:
    """A C identifier derived from ``name``: letters, digits and underscores only, never a keyword."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not out or out[0].isdigit() or out in _C_KEYWORDS or out.startswith("__"):
        out = "m_" + out
    return out


def comment_text(text: str) -> str:
    """Text that can sit inside a // comment: one line, printable ASCII, no continuation backslash."""
    text = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in text.replace("\t", " "))
    return text.rstrip("\\").replace("*/", "* /")
