"""A mask's parameters in a call that has keywords of its own: ``params=`` beside the keyword arguments.

Every call that takes a mask's parameter values (``bind``, ``bind_on_device``, ``DeviceMask.update``,
``create_block_mask``, ``create_mask``) takes them as keyword arguments, ``bind(seq_len=S, docs=[...])``, and as
a mapping, ``params={"docs": [...]}``; both may be given, never the same name twice. A keyword argument that is
the call's own (``device``, ``H``, ``BLOCK_SIZE``, ...) always means what the call says it means: a mask
parameter of that name (tests/catalogue's tiled_natten declares ``H``) is given in ``params=``. Where the call's
keyword is given while the mask declares a parameter of its name and ``params=`` does not give that parameter,
which one was meant is unknown: a :class:`~maskc.errors.BindError` at the parameter's declaration says so and
names the way out, rather than taking one meaning silently. ``params`` itself, like ``self`` and ``num_heads``,
cannot be a parameter's name (:data:`maskc.frontend.params.BIND_KEYWORDS`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Iterator

from maskc import ir
from maskc.errors import BindError


def merged(call: str, params: Mapping[str, Any] | None, values: dict[str, Any]) -> dict[str, Any]:
    """The mask's parameter values of one call: ``params=`` and the keyword arguments ``values`` together."""
    if params is None:
        return values
    if not isinstance(params, Mapping):
        raise TypeError(f"{call}: params= takes a mapping from the mask's parameter names to their values "
                        f"(params={{'docs': [...]}}), not {type(params).__name__}")
    names = [key for key in params if not isinstance(key, str)]
    if names:
        raise TypeError(f"{call}: params= maps parameter names (str) to values; {names[0]!r} is not a name")
    twice = sorted(set(params) & set(values))
    if twice:
        raise TypeError(f"{call}: parameter {twice[0]!r} is given twice, in params= and as {twice[0]}=")
    return {**params, **values}


@contextlib.contextmanager
def own_keywords(call: str, mask: ir.ResolvedMask, params: Mapping[str, Any] | None,
                 own: dict[str, tuple[bool, str]]) -> Iterator[None]:
    """Checks a call's own keywords against the mask's parameters. ``own``: each keyword of the call that a
    parameter could be named, with whether the caller gave it and what it means to the call. A keyword given
    while the mask declares a parameter of its name that ``params=`` does not give is refused (which was meant
    is unknown); a BindError about such a parameter raised inside (bind's: it needs a value) gets a hint naming
    ``params=``."""
    given = set(params or ())
    clashes = {p.name: p for p in mask.params if p.name in own and p.name not in given}
    for name, p in clashes.items():
        passed, meaning = own[name]
        if passed:
            raise BindError(f"{call}({name}=...) is ambiguous: {name}= is {call}'s {meaning}, and mask "
                            f"'{mask.name}' declares a parameter '{name}' too", p.span,
                            f"give the mask's value as params={{'{name}': ...}}; {name}= then means {call}'s "
                            f"{meaning} only")
    try:
        yield
    except BindError as err:
        clash = next((p for p in clashes.values() if p.span == err.span), None)
        if clash is not None and err.hint is None:
            err.hint = (f"{clash.name}= is {call}'s {own[clash.name][1]}: give the mask's '{clash.name}' as "
                        f"params={{'{clash.name}': ...}}")
        raise


__all__ = ["merged", "own_keywords"]
