"""Diagnostics: every message for a user names file:line:col and shows the line with a caret.

One base class, :class:`MaskError`, carries a :class:`Span` and an optional hint. Passes raise it;
the CLI prints ``str(error)`` and exits non-zero, never a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath


SHOWN_LINE = 160        # the most characters of a source line an error draws


@dataclass(frozen=True)
class Span:
    """A place in a source file: 1-based line and column of the first character, and its length."""

    file: str
    line: int
    col: int
    length: int = 1
    source_line: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @property
    def label(self) -> str:
        """``name.mask:line:col``, without the file's directory: what generated code may say of its source
        (a kernel's text, and so the cache key, must not depend on where the .mask file lies)."""
        return f"{PurePath(self.file).name or self.file}:{self.line}:{self.col}"

    def caret(self) -> str:
        """The source line, and under it a caret marking the span (empty if the text is unknown)."""
        if not self.source_line:
            return ""
        # Keep tabs so that the caret lines up with the source in a terminal; show other control
        # characters (a form feed, a carriage return) as their one-column Unicode pictures.
        text = "".join(chr(0x2400 + ord(ch)) if ord(ch) < 0x20 and ch != "\t" else ch
                       for ch in self.source_line.rstrip("\r\n"))
        # A line longer than a terminal is drawn around the caret only, its cut ends marked '…' (a generated
        # line of a megabyte would otherwise fill the screen twice: the line and the spaces before the caret).
        start, end = 0, len(text)
        if len(text) > SHOWN_LINE:
            start = max(0, self.col - 1 - SHOWN_LINE // 2)
            end = min(len(text), start + SHOWN_LINE)
            start = max(0, end - SHOWN_LINE)
        before, after = ("…" if start > 0 else ""), ("…" if end < len(text) else "")
        pad = " " * len(before) + "".join("\t" if ch == "\t" else " " for ch in text[start: self.col - 1])
        width = max(1, min(self.length, end - self.col + 1))
        return f"  {before}{text[start:end]}{after}\n  {pad}^{'~' * (width - 1)}"


NO_SPAN = Span("<maskc>", 1, 1)


class MaskError(Exception):
    """A problem in a user's mask, its parameters or its inputs: a message, a place, maybe a hint."""

    severity = "error"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def __str__(self) -> str:
        where = f"{self.span}: " if self.span else ""
        text = f"{where}{self.severity}: {self.message}"
        caret = self.span.caret() if self.span else ""
        if caret:
            text += "\n" + caret
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class MaskSyntaxError(MaskError):
    """The text does not parse."""


class MaskFileError(MaskError, OSError):
    """A .mask file that cannot be read: missing, a directory, unreadable, too large, not a regular file (an
    import). Also an OSError, so code that reads files and catches OSError catches it too."""


class MaskNameError(MaskError):
    """An unknown or duplicate name."""


class MaskTypeError(MaskError):
    """An expression of the wrong kind, or a call with the wrong arity."""


class ComplexityError(MaskError):
    """A mask whose compilation would pass one of the compiler's work budgets (README, "Limits"): an
    expression too large once lets, mask calls and min/max/abs are expanded, or a rule with too many cases."""


class BindError(MaskError):
    """A run-time parameter value that the mask cannot take."""


class InputError(MaskError):
    """Tensors handed to a kernel that do not fit it (shape, dtype, device, bound mask)."""


def did_you_mean(name: str, candidates) -> str | None:
    """A hint naming the closest candidate, when one is close enough to be a likely typo."""
    import difflib

    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None
