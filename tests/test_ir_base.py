"""maskc.ir.base: the memo passes keep on immutable IR nodes (kept_on)."""
import dataclasses

from maskc import ir


def test_kept_on_computes_once_per_node_and_along_and_stays_out_of_equality():
    lin = ir.Lin(((ir.Pos("q"), 2),), 3)
    twin = ir.Lin(((ir.Pos("q"), 2),), 3)
    calls = []

    def compute(value):
        calls.append(value)
        return value

    assert ir.kept_on(lin, "_memo", lambda: compute(None)) is None     # a kept None is kept, not recomputed
    assert ir.kept_on(lin, "_memo", lambda: compute(1)) is None and calls == [None]
    assert lin == twin and hash(lin) == hash(twin) and repr(lin) == repr(twin)
    assert ir.kept_on(twin, "_memo", lambda: compute(2)) == 2          # kept per node, not per value
    assert ir.kept_on(dataclasses.replace(lin), "_memo", lambda: compute(3)) == 3   # a replaced node starts anew
    first, second = object(), object()
    assert ir.kept_on(lin, "_along", lambda: compute("a"), along=first) == "a"
    assert ir.kept_on(lin, "_along", lambda: compute("b"), along=first) == "a"
    assert ir.kept_on(lin, "_along", lambda: compute("c"), along=second) == "c"       # another object: again
    assert calls == [None, 2, 3, "a", "c"]
