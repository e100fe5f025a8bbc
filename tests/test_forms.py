"""Forms as text (explain, lint's messages and hints): what render writes reads back as the same form."""
import numpy as np
from hypothesis import given, settings, strategies as st

import maskc
from maskc.analysis import forms as F

HEADER = "mask m(a: int, c: int)"


@st.composite
def expression(draw, depth: int = 3):
    """An integer expression of q, k and parameters through every operator a form keeps as a term."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(["q", "k", "a", "c", "seq_len"])) if draw(st.booleans()) else \
            str(draw(st.integers(-6, 9)))
    a, b = draw(expression(depth - 1)), draw(expression(depth - 1))
    op = draw(st.sampled_from(["+", "-", "*", "//", "%", "&", "|", "^", ">>", "<<", "min", "max", "abs", "neg",
                               "ceildiv"]))
    if op in ("//", "%", "ceildiv"):
        d = draw(st.sampled_from(["3", "a", "(c + 1)"]))
        return f"ceildiv({a}, {d})" if op == "ceildiv" else f"({a}) {op} {d}"
    if op in (">>", "<<"):
        return f"({a}) {op} {draw(st.integers(0, 3))}"
    if op == "*":
        return f"{draw(st.integers(-3, 3))} * ({a})"
    if op in ("min", "max"):
        return f"{op}({a}, {b})"
    if op == "abs":
        return f"abs({a})"
    if op == "neg":
        return f"-({a})"
    return f"({a}) {op} ({b})"


@settings(max_examples=150, deadline=None)
@given(expression(), expression(), st.integers(1, 5), st.integers(0, 6))
def test_rendered_atoms_read_back_as_the_same_mask(left, right, a, c):
    """Every atom of a normalized rule, written by render and parsed again, selects the same pairs."""
    text = f"{HEADER}\n  allow {left} <= {right}\n"
    try:
        mask = maskc.compile_mask(text)
    except maskc.MaskError:
        return                                  # past a budget, or an opaque form: not this test's business
    regions = [" and ".join(f"{F.render(atom.lin)} <= 0" for atom in region.atoms) or "true"
               for region in mask.normal.allow]
    seq_len = 24
    dense = mask.bind(seq_len, a=a, c=c).dense()
    if not regions:                             # normalize proved the rule never holds
        assert not dense.any()
        return
    again = maskc.compile_mask(f"{HEADER}\n" + "".join(f"  allow {r}\n" for r in regions))
    assert np.array_equal(dense, again.bind(seq_len, a=a, c=c).dense()), regions
