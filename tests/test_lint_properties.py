"""Lint's dead-rule warnings are proofs: each one checked against the dense mask by brute force."""
import tempfile
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

import maskc
from maskc.errors import MaskError
from maskc.lint import lint_file
from mask_strategies import binding, mask_text


def _dense(text: str, bind_args):
    """The visible pairs of a mask text at these sizes (all hidden for a mask with no allow rule left)."""
    seq_len, kv_len, params = bind_args
    try:
        return maskc.compile_mask(text).bind(seq_len, kv_len, **params).dense()
    except MaskError as err:
        if "no 'allow' rule" in err.message:
            return None
        raise


def _without_line(text: str, line: int) -> str | None:
    """The text without that line; None when no rule would be left."""
    lines = text.splitlines(keepends=True)
    rest = lines[:line - 1] + lines[line:]
    return "".join(rest) if len(rest) > 1 else None


@settings(max_examples=150)
@given(mask_text(exact=False), binding(max_len=40))
def test_dead_rule_warnings_hold_on_the_dense_mask(text, bind_args):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.mask"
        path.write_text(text)
        diags = lint_file(path)
    if any(d.severity == "error" for d in diags):
        return
    try:
        full = _dense(text, bind_args)
    except MaskError:          # values this mask's requires or divisors refuse
        return
    for d in diags:
        if "can never hold" in d.message or "cancel" in d.message or "removes nothing" in d.message:
            event(d.message.split(":")[0])
            shorter = _without_line(text, d.line)
            rest = None if shorter is None else _dense(shorter, bind_args)
            expected = full if rest is not None else None
            if rest is None:      # the rule was the mask's only allow: the mask shows nothing
                assert full is None or not full.any(), (d, text)
            else:
                assert (rest == expected).all(), (d, text)
