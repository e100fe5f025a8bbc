"""How maskc builds and runs kernels, as one value: :class:`Options`.

Everything that is not the mask, the shapes or the dtype: the forward engine and tiles, autotuning, the
backward's engine and dQ reduction, the wgmma_tma kernel's experiment switches and its masking of PARTIAL tiles, waiting after each launch,
the disk cache's directory, the target architecture and the memory cap on descriptors. ``Options()`` is
the product's defaults. The API (``maskc.attention(..., options=...)``, :mod:`maskc.runtime`,
:mod:`maskc.runtime.torch_ops`) and the CLI take an Options; the passes below them take the values decided from it
(``choose_tiles(..., engine=)``, ``plan_forward(spec, overlap=, ...)``, ``emit_kernel(spec, options)``).

The ``MASKC_*`` environment variables are read here and nowhere else, by :meth:`Options.from_environment`:
the API's entry points call it when no options are given, the CLI starts from it. :data:`ENVIRONMENT`
lists them (README's "Options and environment variables" section describes each). A value that cannot be
read is a ValueError naming the variable, not a silent default.

Options reach a kernel only through what they decide (tiles, engine, the plan's switches, the target),
which the rendered source and NVRTC's options carry into the cache key; ``sync``, ``cache_dir`` and
``autotune`` decide nothing in a kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from maskc.analysis.order import parse_order
from maskc.codegen.schedule import Tiles, check_target
from maskc.kernel_ir import (BACKWARD_ENGINES, DETERMINISTIC_DQ, DQ_REDUCTIONS, DQ_TURN_ORDERS, ENGINES,
                             EXP2_EMULATION, MAX_DESCRIPTOR_BYTES, PARTIAL_TILES)

# variable -> the Options field it sets
ENVIRONMENT = {
    "MASKC_ENGINE": "engine",
    "MASKC_AUTOTUNE": "autotune",
    "MASKC_BWD_ENGINE": "backward_engine",
    "MASKC_BWD_DQ_REDUCTION": "dq_reduction",
    "MASKC_WGMMA_OVERLAP": "overlap",
    "MASKC_WGMMA_PINGPONG": "pingpong",
    "MASKC_DEBUG_WAITS": "debug_waits",
    "MASKC_SYNC": "sync",
    "MASKC_CACHE_DIR": "cache_dir",
    "MASKC_ARCH": "arch",
    "MASKC_MAX_DESCRIPTOR_BYTES": "max_descriptor_bytes",
    "MASKC_TOKEN_ORDER": "token_order",
    "MASKC_PARTIAL_TILES": "partial_tiles",
    "MASKC_EXP2_EMULATION": "exp2_emulation",
    "MASKC_DQ_TURN_ORDER": "dq_turn_order",
    "MASKC_DETERMINISTIC_DQ": "deterministic_dq",
    "MASKC_LONG_ROWS_FIRST": "long_rows_first",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Options:
    """Every choice of how to build and run a kernel (see the module docstring). ``None``: the schedule's
    (or the GPU's) choice."""

    engine: str | None = None           # forward engine (kernel_ir.ENGINES); None: the schedule's
    tiles: Tiles | None = None          # forward (block_m, block_n, num_warps[, engine]): overrides engine
    autotune: bool = False              # time the forward candidates on the first call, keep the fastest
    backward_engine: str | None = None  # the dK/dV kernel's (kernel_ir.BACKWARD_ENGINES); None: the schedule's
    dq_reduction: str | None = None     # how the wgmma dK/dV kernel adds dQ (kernel_ir.DQ_REDUCTIONS)
    # wgmma_tma experiments (bench/NOTES.md): S of the next tile overlapping P V of this one; consumer
    # warpgroups taking turns issuing products (measured 4-11% faster at 32K on every example mask but
    # clear, 5% slower, run 19); barrier waits that give up after about a second with a report (a hang)
    overlap: bool = True
    pingpong: bool = True
    debug_waits: bool = False
    sync: bool = False                  # wait after each launch: an asynchronous fault surfaces at its call
    cache_dir: str | None = None        # compiled kernels and autotuning results; None: ~/.cache/maskc
    arch: str | None = None             # build target (schedule.ARCHES, compute_XY); None: the GPU's own
    # the most bytes a bound mask's descriptor may take (BoundMask.descriptor's max_bytes): a BindError past it
    max_descriptor_bytes: int = MAX_DESCRIPTOR_BYTES
    # the token order masks over an image run in (maskc.ordered): "auto" (per binding, where it saves work),
    # "raster" (never reordered) or a patch shape "ROWSxCOLS" (asked for: an error where it cannot apply)
    token_order: str = "auto"
    # how the wgmma_tma forward and the backward mask the PARTIAL tiles of an exact mask with chunked regions:
    # "bits" (the tile path: each row's visible keys as interval bit words, maskc.codegen.tile_bits), "elements"
    # (the element path: the raster mask's test per pair from row and key-column values, maskc.codegen.elements),
    # "stored" (every PARTIAL tile's visibility built once per binding, where the mask reads no h) or "auto"
    # (stored where it applies, else bits: kernel_ir.AUTO_STORED); other masks and engines keep their one path
    partial_tiles: str = "auto"
    # the wgmma_tma forward's softmax computes 2^x on the FMA pipe (a polynomial) for 1 column tile (8 keys) in
    # this many, on the SFU for the others: 0 (never: the default), 1, 2, 4 or 8. An experiment: slower on the
    # H200 even for softcap, whose tanh also takes the SFU (run 58: 0.97x at 4; bench/NOTES.md)
    exp2_emulation: int = 0
    # the deterministic wgmma_tma backward's launch order, which its dQ turns follow (kernel_ir.DQ_TURN_ORDERS):
    # "shortest" (every column shortest first) or "wave" (one wave of CTAs shortest first, then longest first:
    # modelled 0.80x -> 0.97x of the fast mode at 4K, bench/turns_model.py; slower on CLEAR at 32K, run 73)
    dq_turn_order: str = "shortest"
    # how the deterministic wgmma_tma backward computes dQ (kernel_ir.DETERMINISTIC_DQ): "turns" (in the dK/dV
    # kernel, each query block's contributions added in launch order) or "kernel" (its own kernel: no waits, two
    # more products per tile; for masks whose query blocks gather many columns at once, such as CLEAR's text rows)
    deterministic_dq: str = "turns"
    # the launches in L2 sections of heads (the wgmma_tma forward, the dK/dV kernels outside the deterministic
    # turns) take the rows (columns) that would end well after the last section first, for every head
    # (maskc.runs.front_rows: CLEAR's text rows; measured 1.07x its 32K forward, 1.13x its backward, run 76); the
    # other masks have no such rows, so nothing changes for them. False: every row in its section
    long_rows_first: bool = True

    # token: these options as a string (JSON), for where only plain values may pass (the torch custom ops'
    # schemas); :func:`from_token` reads it back. Set by __post_init__.
    token: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_choice("engine", self.engine, ENGINES)
        _check_choice("backward engine", self.backward_engine, BACKWARD_ENGINES)
        _check_choice("dQ reduction", self.dq_reduction, DQ_REDUCTIONS)
        _check_choice("partial tiles", self.partial_tiles, PARTIAL_TILES)
        _check_choice("dQ turn order", self.dq_turn_order, DQ_TURN_ORDERS)
        _check_choice("deterministic dQ", self.deterministic_dq, DETERMINISTIC_DQ)
        if self.exp2_emulation not in EXP2_EMULATION or isinstance(self.exp2_emulation, bool):
            raise ValueError(f"exp2 emulation {self.exp2_emulation!r}: expected one of "
                             f"{', '.join(map(str, EXP2_EMULATION))} (1 column tile in that many; 0: none)")
        if self.tiles is not None:
            try:
                tiles = Tiles(*self.tiles)
            except TypeError:
                raise ValueError(f"tiles {self.tiles!r}: expected (block_m, block_n, num_warps[, engine])") from None
            if not all(isinstance(n, int) and n > 0 for n in tiles[:3]):
                raise ValueError(f"tiles {self.tiles!r}: block_m, block_n and num_warps are positive integers")
            _check_choice("engine", tiles.engine, ENGINES)
            if self.autotune:
                raise ValueError("tiles and autotune both choose the forward tiles: give one")
            object.__setattr__(self, "tiles", tiles)
        if self.arch is not None:
            check_target(self.arch)       # ValueError unless one of schedule.ARCHES or compute_XY (PTX_CAPABILITIES)
        cap = self.max_descriptor_bytes
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"max_descriptor_bytes {cap!r}: expected a positive number of bytes")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if not isinstance(self.token_order, str) or (self.token_order not in ("auto", "raster")
                                                     and parse_order(self.token_order) is None):
            raise ValueError(f"token order {self.token_order!r}: expected 'auto', 'raster' or a patch shape such as "
                             "'8x16' (rows x columns)")
        # A plain attribute, not a property: torch.compile reads it while tracing (maskc.runtime.torch_ops).
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        object.__setattr__(self, "token", json.dumps(fields, sort_keys=True, separators=(",", ":")))

    def __hash__(self) -> int:
        """The token's (equal options write equal tokens): a str caches its hash, so a call's cache key built
        from these options does not hash the fields again on every call."""
        return hash(self.token)

    def __repr__(self) -> str:
        """Only what differs from the defaults: ``Options(engine='mma', sync=True)``."""
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                   if f.init and getattr(self, f.name) != f.default]
        return f"Options({', '.join(changed)})"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "Options":
        """The options the ``MASKC_*`` variables of ``environ`` (default: this process's) set, the defaults
        for the others. An empty variable counts as unset; switches take 1/0 (or true/false, yes/no,
        on/off). ValueError naming the variable for a value it cannot take."""
        env = os.environ if environ is None else environ
        return _from_values(tuple(env.get(name) or None for name in ENVIRONMENT))

    def replace(self, **changes: Any) -> "Options":
        return dataclasses.replace(self, **changes)

    @property
    def cache_path(self) -> Path | None:
        """The disk cache's directory: ``cache_dir``, else the XDG rule of :func:`maskc.runtime.cache.location`
        (``$XDG_CACHE_HOME/maskc``, else ``<home>/.cache/maskc``); None where there is no home."""
        from maskc.runtime.cache import location
        return location({**os.environ, "MASKC_CACHE_DIR": self.cache_dir or ""})

    @property
    def forward_switches(self) -> tuple[bool, bool, bool, str, int]:
        """(overlap, pingpong, debug_waits, partial_tiles, exp2_emulation): what the forward plan takes of these
        options besides tiles."""
        return self.overlap, self.pingpong, self.debug_waits, self.partial_tiles, self.exp2_emulation



def options_of(value: Any, where: str) -> Options:
    """The options a call to ``where`` was given: ``value`` itself, or for None those of the environment. A
    TypeError naming what ``where`` takes for anything else (a token order's string, a dict), rather than an
    AttributeError from deep inside the call."""
    if value is None:
        return Options.from_environment()
    if not isinstance(value, Options):
        raise TypeError(f"{where} takes options as a maskc.Options (such as Options(engine='mma') or "
                        f"Options(token_order='8x16')), not {type(value).__name__} {value!r}")
    return value


def from_token(token: str) -> Options:
    """The options :attr:`Options.token` wrote; ``""`` means those of the environment (read now, on every
    call: the environment may have changed since the last)."""
    return _parsed_token(token) if token else Options.from_environment()


@functools.lru_cache(maxsize=64)
def _parsed_token(token: str) -> Options:
    """The options of a non-empty token (cached: the torch ops read theirs on every call)."""
    fields = json.loads(token)
    if fields.get("tiles") is not None:
        fields["tiles"] = Tiles(*fields["tiles"])
    return Options(**fields)


def _check_choice(what: str, value: str | None, known: tuple[str, ...]) -> None:
    if value is not None and value not in known:
        raise ValueError(f"{what} {value!r} unknown (known: {', '.join(known)})")


def _switch(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected 1 or 0")


@functools.lru_cache(maxsize=64)
def _from_values(values: tuple[str | None, ...]) -> Options:
    """Options from the variables' values in ENVIRONMENT's order (cached: the API reads them on every call)."""
    raw = dict(zip(ENVIRONMENT, values))
    defaults = Options()
    fields: dict[str, Any] = {}
    for name, field in ENVIRONMENT.items():
        value = raw[name]
        if isinstance(getattr(defaults, field), bool):
            fields[field] = _switch(name, value, getattr(defaults, field))
        elif value is None:
            fields[field] = getattr(defaults, field)
        elif isinstance(getattr(defaults, field), int):
            fields[field] = int(value) if value.strip().isdigit() else value    # else refused below, named
        else:
            fields[field] = value
    for name, field in ENVIRONMENT.items():     # each variable alone first, so that an error names it
        try:
            Options(**{field: fields[field]})
        except ValueError as err:
            raise ValueError(f"{name}={raw[name]!r}: {err}") from None
    return Options(**fields)


DEFAULT = Options()

__all__ = ["Options", "ENVIRONMENT", "DEFAULT", "from_token"]
