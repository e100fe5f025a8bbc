"""The descriptor builder's plan: what the generated kernels that build a device mask's descriptor need.

Beside :mod:`maskc.kernel_ir` (whose :class:`~maskc.kernel_ir.Predicate` it carries): rendered by
:mod:`maskc.codegen.descriptor_build`, launched by :mod:`maskc.runtime.device_builder`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from maskc.kernel_ir import Predicate


@dataclass(frozen=True)
class SegmentCheck:
    """One segments parameter as the descriptor builder checks it: its table's slot in the header, the extent
    it partitions (``mask[extent]``: 0 seq_len, 1 kv_len) and its bit in the status word."""

    name: str
    slot: int
    extent: int
    bit: int
    origin: str = "0"           # its start (the ``from`` expression) as C over the table's ints


@dataclass(frozen=True)
class RequireCheck:
    """One `require` rule as the builder's ``validate`` kernel checks it (:mod:`maskc.codegen.require_checks`):
    ``source`` defines ``bool maskc_require<index>(mask, b, h, q)``; ``positions`` where it is checked: "every"
    query position, the "starts" of the segments whose header slots ``seg_slots`` holds (and 0), or "once" (q = 0:
    it reads no position). Bit ``index`` of status[2] when it fails."""

    index: int
    source: str
    positions: str
    seg_slots: tuple[int, ...] = ()


@dataclass(frozen=True)
class BuilderSpec:
    """Every decision the descriptor builder's template needs (``templates/descriptor_build.cu.j2``, rendered by
    :mod:`maskc.codegen.descriptor_build`): the mask's predicate (64-bit forms: no binding proved narrower),
    whose ``mask_row`` gives each row's region intervals; its segments parameters, whose bounds ``validate`` writes
    from the staged lengths and checks; its `require` rules, checked there too."""

    mask_name: str
    predicate: Predicate
    segments: tuple[SegmentCheck, ...] = ()
    requires: tuple[RequireCheck, ...] = ()
    mask_summary: tuple[str, ...] = field(default=())
    arch: str = "sm_90a"
    threads: int = 256          # the row-block kernels' CTA
    window: int = 4096          # key blocks a row-block CTA counts at once (9 bytes of shared memory each)

    # the kernels, in launch order (templates/descriptor_kernels.cu.j2 says what each does)
    ROLES: ClassVar[tuple[str, ...]] = ("validate", "rows", "cols", "order")

    def entry_for(self, role: str) -> str:
        """The entry point of one of ``ROLES``: ``maskc_<role>_<mask>``."""
        assert role in self.ROLES, role
        return f"maskc_{role}_{self.mask_name}"

    @property
    def entry(self) -> str:
        return self.entry_for("rows")

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(self.entry_for(role) for role in self.ROLES)
