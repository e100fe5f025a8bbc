"""Resolve's environment: the files a resolution may look in (:class:`Program`) and what a name means where it is
used (:class:`Scope`: a parameter, a ``let``, or an argument of a let function, already resolved)."""
from __future__ import annotations

from dataclasses import dataclass

from maskc import ir
from maskc.errors import Span


@dataclass(frozen=True)
class Program:
    """The files a resolution may look in: the main file first, then its imports (transitively); ``imports``: the
    paths each file's import lines found, by the file's path (empty: every file sees every other)."""

    files: tuple[ir.SourceFile, ...]
    imports: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def main(self) -> ir.SourceFile:
        return self.files[0]

    def visible_from(self, here: ir.SourceFile) -> tuple[ir.SourceFile, ...]:
        """The files whose masks ``here`` can call: those it imports, and theirs, transitively (``here`` first)."""
        if not self.imports:
            return self.files
        edges = dict(self.imports)
        reached, todo = {here.path}, [here.path]
        while todo:
            for path in edges.get(todo.pop(), ()):
                if path not in reached:
                    reached.add(path)
                    todo.append(path)
        return tuple(f for f in self.files if f.path in reached)


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
