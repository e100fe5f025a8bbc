"""Hypothesis strategies for fuzzing: whole .mask files that the grammar accepts (every construct, names
that may or may not resolve, deep and wide expressions), and parameter values at the edges of int32 and
int64.

Unlike :mod:`mask_strategies` (well-typed masks with valid values, for property tests against dense()),
these aim at the compiler's corners: most drawn files parse, many do not resolve, and every error must be
a located MaskError.
"""
from __future__ import annotations

from hypothesis import strategies as st

INT32 = 2 ** 31 - 1
INT64 = 2 ** 63 - 1

# Near every boundary a value can be checked against: 0, int32, int64, and past them.
EDGES = (0, 1, INT32, INT32 + 1, 2 ** 32, INT64, INT64 + 1, 2 ** 64)


def edge_int(spread: int = 2 ** 10) -> st.SearchStrategy[int]:
    """Integers within ``spread`` of 0, ±(2**31 - 1), ±2**32, ±(2**63 - 1), ±2**64, and small ones."""
    near = st.tuples(st.sampled_from(EDGES), st.integers(-spread, spread), st.sampled_from((1, -1)))
    return st.one_of(st.integers(-64, 64), near.map(lambda t: t[2] * (t[0] + t[1])))


LITERALS = st.one_of(st.integers(0, 40), st.sampled_from([0, 1, 2, 7, 64, 2 ** 15, INT32, INT32 + 1, 2 ** 40]))
NAMES = ["a", "c", "w", "n", "docs", "t", "sub", "x", "y", "f", "g", "m", "other", "causal",
         "q", "k", "h", "b", "seq_len", "kv_len", "same", "abs", "min", "max", "clamp", "ceildiv", "zz"]
PARAM_TYPES = ["", ": int", ": const int", ": segments", ": segments from a", ": segments from a + 1",
               ": per docs", ": per sub", ": per t"]


class _Gen:
    """Draws the pieces of one file; ``draw`` is Hypothesis's, ``budget`` caps the expression nodes."""

    def __init__(self, draw, budget: int):
        self.draw = draw
        self.budget = budget

    def name(self) -> str:
        return self.draw(st.sampled_from(NAMES))

    def expr(self, depth: int) -> str:
        self.budget -= 1
        d = self.draw
        if depth <= 0 or self.budget <= 0 or d(st.integers(0, 3)) == 0:
            leaf = d(st.integers(0, 5))
            if leaf == 0:
                return str(d(LITERALS))
            if leaf == 1:
                return d(st.sampled_from(["true", "false"]))
            return self.name()
        kind = d(st.integers(0, 13))
        a = lambda: self.expr(depth - 1)  # noqa: E731
        if kind <= 2:
            return f"{a()} {d(st.sampled_from(['+', '-', '*', '//', '%']))} {a()}"
        if kind == 3:
            return f"({a()})"
        if kind == 4:
            return f"-{a()}" if d(st.booleans()) else f"+{a()}"
        if kind == 5:
            return f"{self.atom()} ** {d(st.integers(0, 70))}"
        if kind == 6:
            fn = d(st.sampled_from(["abs", "min", "max", "clamp", "ceildiv", "same", "f", "g", "m", "causal", "x"]))
            args = [a() for _ in range(d(st.integers(0, 3)))]
            if d(st.integers(0, 4)) == 0:
                args.append(f"{self.name()}={a()}")
            return f"{fn}({', '.join(args)})"
        if kind == 7:
            method = d(st.sampled_from(["start", "end", "length", "index", "bogus"]))
            return f"{self.name()}.{method}({a() if d(st.integers(0, 5)) else ''})"
        if kind == 8:
            ops = d(st.lists(st.sampled_from(["<", "<=", "==", "!=", ">", ">="]), min_size=1, max_size=3))
            out = a()
            for op in ops:
                out += f" {op} {a()}"
            return out
        if kind == 9:
            br = d(st.sampled_from(["[]", "[)", "(]", "()"]))
            neg = "not " if d(st.booleans()) else ""
            return f"{a()} {neg}in {br[0]}{a()}, {a()}{br[1]}"
        if kind == 10:
            return f"not {a()}"
        if kind == 11:
            return f"({a()} {d(st.sampled_from(['and', 'or']))} {a()})"
        if kind == 12:
            return f"abs({a()} - {a()})"
        return f"min({a()}, max({a()}, {a()}))"

    def atom(self) -> str:
        d = self.draw
        return self.name() if d(st.booleans()) else str(d(st.integers(-3, 40)))

    def conditions(self, depth: int) -> str:
        return ", ".join(self.expr(depth) for _ in range(self.draw(st.integers(1, 3))))

    def param(self) -> str:
        d = self.draw
        out = self.name() + d(st.sampled_from(PARAM_TYPES))
        if d(st.integers(0, 3)) == 0:
            out += f" = {self.expr(1)}"
        return out

    def mask(self, depth: int) -> str:
        d = self.draw
        params = ", ".join(self.param() for _ in range(d(st.integers(0, 4))))
        head = f"mask {self.name()}({params})"
        if d(st.integers(0, 5)) == 0:
            return f"{head} = {self.conditions(depth)}\n"
        lines = [head]
        for _ in range(d(st.integers(1, 5))):
            kind = d(st.sampled_from(["allow", "allow", "deny", "require", "let", "letf"]))
            if kind == "let":
                lines.append(f"  let {self.name()} = {self.expr(depth)}")
            elif kind == "letf":
                args = ", ".join(self.name() for _ in range(d(st.integers(1, 2))))
                lines.append(f"  let {self.name()}({args}) = {self.expr(depth)}")
            else:
                lines.append(f"  {kind} {self.conditions(depth)}")
        return "\n".join(lines) + "\n"


@st.composite
def grammar_file(draw, max_depth: int = 5, budget: int = 120) -> str:
    """A .mask file built from the grammar's productions: one to three masks (plus comments and blank lines),
    expressions up to ``max_depth`` deep and ``budget`` nodes in all."""
    gen = _Gen(draw, budget)
    depth = draw(st.integers(1, max_depth))
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 4)) == 0:
            parts.append("# a comment\n\n")
        parts.append(gen.mask(depth))
    return "".join(parts)


@st.composite
def chain_file(draw) -> str:
    """Shapes whose size grows fast under inlining and normalization: let chains that reuse the previous
    binding, nested abs/min/max, long or-chains of !=, powers."""
    n = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["double", "abs", "minmax", "ne", "pow", "call"]))
    if kind == "double":
        lets = "".join(f"  let x{i + 1} = x{i} + x{i}\n" for i in range(n))
        return f"mask m()\n  let x0 = q - k\n{lets}  allow x{n} >= 0\n"
    if kind == "abs":
        return "mask m()\n  allow " + "abs(" * n + "k - q" + " - 1)" * n + " <= 3\n"
    if kind == "minmax":
        body = "k"
        for i in range(n):
            body = f"{'min' if i % 2 else 'max'}({body}, q - {i})"
        return f"mask m()\n  allow {body} <= q\n"
    if kind == "ne":
        return "mask m()\n  allow k <= q, " + ", ".join(f"k != q - {i}" for i in range(n)) + "\n"
    if kind == "pow":
        return f"mask m(a: int)\n  allow k <= q + (a - 1) ** {n}\n"
    lets = "".join(f"  let f{i + 1}(x) = f{i}(x) + f{i}(x + 1)\n" for i in range(n))
    return f"mask m()\n  let f0(x) = x\n{lets}  allow f{n}(k) <= q\n"
