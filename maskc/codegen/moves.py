"""The token order's moves as CUDA: a :class:`MoveSpec` -> ``KernelSource`` (``templates/token_moves.cu.j2``).

A call in a token order (:mod:`maskc.ordered`) moves q, k, v (and, backward, O, dO, LSE) along the sequence into
the order and the results back. The moves kernel does it for every array of a call in one launch: each CTA copies
whole token rows of one (operand, batch element, head), 16 bytes a load for rows of head-dim data, 4 for an LSE
row, through the order's index map (``templates/token_map.cu.j2``: one ``__host__ __device__`` function, the
order's numbers compiled in). Everything is decided here: the order, the direction, and per operand its unit, rows
per CTA and units per thread; :mod:`maskc.runtime.moves` plans the launch from the arrays and runs it.

LSE rides in the same launch as an operand of 4-byte units rather than in a second one: its CTAs are about 1/60
of the forward's (one float a token against 256 bytes), and a launch of its own would cost a few microseconds of
latency on every call, as much as moving it.
"""
from __future__ import annotations

from dataclasses import dataclass

from maskc.analysis.order import TokenOrder
from maskc.codegen.emit import _environment, nvrtc_options, template_dir
from maskc.kernel_ir import KernelSource

TEMPLATE_NAME = "token_moves.cu.j2"
MAP_TEMPLATE_NAME = "token_map.cu.j2"
THREADS = 256
IN_FLIGHT = 4
"""Units each thread loads before it stores: 64 bytes of head-dim rows (4 vectors of 16), with ~8 CTAs of 256
threads resident per SM 128 KB in flight per SM, several times what the H200's bandwidth times its latency asks
for. LSE rows (4-byte units) move 16 bytes a thread: they are 1/64 of the bytes."""
UNIT_TYPES = {16: "uint4", 4: "unsigned"}
"""The unit sizes the kernel moves rows in, and their C types: 16 bytes for rows of head-dim data (a multiple of
16 bytes), 4 for rows of one float (LSE, its gradient)."""


@dataclass(frozen=True)
class MovedOperand:
    """One operand's shape of work: rows of ``units`` units of ``unit`` bytes, ``tile`` rows per CTA, each thread
    ``per_thread`` units of them."""

    unit: int
    units: int
    tile: int
    per_thread: int

    @property
    def unit_type(self) -> str:
        return UNIT_TYPES[self.unit]

    @property
    def row_bytes(self) -> int:
        return self.unit * self.units


def moved_operand(row_bytes: int, threads: int = THREADS) -> MovedOperand | None:
    """The work of an operand whose token rows are ``row_bytes`` long: 16-byte units where they divide the row,
    else 4-byte ones; IN_FLIGHT units a thread, as many rows per CTA as that makes (at least one, with more units
    a thread where one row has more than the CTA's threads take). None: a row the kernel cannot move (not a
    multiple of 4 bytes)."""
    unit = next((u for u in sorted(UNIT_TYPES, reverse=True) if row_bytes > 0 and row_bytes % u == 0), None)
    if unit is None:
        return None
    units = row_bytes // unit
    tile = max(1, threads * IN_FLIGHT // units)
    return MovedOperand(unit, units, tile, -(-tile * units // threads))


@dataclass(frozen=True)
class MoveSpec:
    """Every decision the moves kernel's template needs: the order, the direction (``into`` the order, or back to
    raster), the operands in launch order, the CTA size and the target."""

    order: TokenOrder
    into: bool
    operands: tuple[MovedOperand, ...]
    arch: str = "sm_90a"
    threads: int = THREADS

    @property
    def entry(self) -> str:
        return f"maskc_moves_{'into' if self.into else 'back'}"

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        """The kernel's parameters in signature order, (C type, name): the sequence's length and the end of its
        last whole band, then per operand j its source and destination, their batch, head and token strides in
        bytes, its heads, and ``xj_end``, the grid's blocks up to its last."""
        out = [("int", "seq_len"), ("int", "end")]
        for j in range(len(self.operands)):
            x = f"x{j}"
            out += [("const char*", f"{x}_src"), ("char*", f"{x}_dst")]
            out += [("long long", f"{x}_{side}_{axis}") for side in ("src", "dst") for axis in "bhs"]
            out += [("int", f"{x}_heads"), ("int", f"{x}_end")]
        return tuple(out)

    @property
    def signature(self) -> str:
        """The parameters as C, an operand's to a line."""
        return ",".join(("\n    " if n.endswith("_src") else " ") + f"{t} {n}" for t, n in self.params).lstrip()

    @property
    def arguments(self) -> str:
        return ", ".join(n for _, n in self.params)

    @property
    def order_text(self) -> str:
        return str(self.order)

    @property
    def operand_lines(self) -> tuple[str, ...]:
        return tuple(f"x{j}: rows of {op.row_bytes} bytes in {op.unit}-byte units, {op.tile} rows a CTA, "
                     f"{op.per_thread} units a thread" for j, op in enumerate(self.operands))


def check_move_spec(spec: MoveSpec) -> None:
    """The invariants the template relies on (it re-checks the per-thread count with a static_assert)."""
    if not spec.operands:
        raise ValueError("a moves kernel needs at least one operand")
    if spec.threads % 32 or not 32 <= spec.threads <= 1024:
        raise ValueError(f"moves kernel: {spec.threads} threads is not whole warps, at most 1024")
    for op in spec.operands:
        if op.unit not in UNIT_TYPES or op.units < 1 or op.tile < 1:
            raise ValueError(f"moves kernel: operand {op} has no unit the kernel moves")
        if not (op.per_thread * spec.threads >= op.tile * op.units > (op.per_thread - 1) * spec.threads):
            raise ValueError(f"moves kernel: operand {op}: per_thread does not cover the tile")


def emit_moves(spec: MoveSpec) -> KernelSource:
    """Render the moves kernel of ``spec`` (entry ``spec.entry``)."""
    check_move_spec(spec)
    source = _environment(str(template_dir())).get_template(TEMPLATE_NAME).render(spec=spec)
    return KernelSource(spec=spec, source=source, entry=spec.entry, options=nvrtc_options(spec.arch))


def token_map_source() -> str:
    """The index map alone (``struct TokenMap``, ``token_raster``): plain C++ where ``__host__``, ``__device__``
    and ``__forceinline__`` are defined away (the host's tests compile it with g++)."""
    return _environment(str(template_dir())).get_template(MAP_TEMPLATE_NAME).render()
