"""Resolve's environment: the files a resolution may look in (:class:`Program`) and what a name means where it is
used (:class:`Scope`: a parameter, a ``let``, or an argument of a let function, already resolved)."""
from __future__ import annotations

from dataclasses import dataclass

from maskc import ir
from maskc.errors import Span


@dataclass(frozen=True)
class Program:
    """The files a resolution may look in: the main file first, then its imports (transitively)."""

    files: tuple[ir.SourceFile, ...]

    @property
    def main(self) -> ir.SourceFile:
        return self.files[0]


@dataclass(frozen=True)
class Let:
    """A ``let`` binding: its value, resolved at each use in the scope it was written in."""

    args: tuple[str, ...]
    value: ir.Syntax
    scope: "Scope"
    span: Span


@dataclass(frozen=True)
class Scope:
    """What a name means where it is used: a bound IntExpr, a let, or a parameter of the mask."""

    values: tuple[tuple[str, object], ...]   # innermost last
    mask: ir.MaskDecl

    def lookup(self, name: str):
        for key, value in reversed(self.values):
            if key == name:
                return value
        return None

    def bind(self, name: str, value) -> "Scope":
        return Scope(self.values + ((name, value),), self.mask)

    def names(self):
        return [k for k, _ in self.values]
