"""The GPU boundary: compile (cached), upload descriptors (cached), validate inputs, launch the forward and
backward kernels.

This is the only maskc module that touches CuPy or torch, and it imports them lazily, so ``import maskc``
works on a machine without either. What it asks of a bound mask (``maskc`` binds a mask to sizes)::

    bound.seq_len, bound.kv_len       query and key lengths the mask was bound to
    bound.batch                       B, or 1 when the mask is the same for every batch element
    bound.num_heads                   None when the mask does not depend on the head, else Hq
    bound.descriptor(block_m, block_n) -> kernel_ir.Descriptor
    bound.kernel_spec(head_dim=, dtype=, block_m=, block_n=, num_warps=) -> kernel_ir.KernelSpec
    bound.backward_spec(head_dim=, dtype=) -> kernel_ir.BackwardSpec

A mask over an image for which ``Options.token_order`` picks a token order (:mod:`maskc.ordered`) runs as the
rewritten mask on q, k, v (and, backward, O, dO, LSE) moved into the order, its results moved back, each way in
one launch (:mod:`maskc.runtime.permute`, :mod:`maskc.runtime.moves`), forward and backward alike.

Compiled kernels are cached in memory and as cubins in the disk cache (:mod:`maskc.runtime.cache`, in
``Options.cache_path``), keyed by a hash of source, NVRTC options, NVRTC version and maskc version, so a
second process loads the cubin instead of compiling. Every entry point takes ``options``
(:class:`maskc.options.Options`); without them, those of the environment (``Options.from_environment``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from maskc.codegen.plan import POINTERS, TENSOR_MAPS, BackwardPlan
from maskc.codegen.schedule import Tiles, choose_backward_tiles, choose_tiles, forward_candidates
from maskc.kernel_ir import AUTO_STORED, BACKWARD_ROW_PAD as ROW_PAD, BackwardSpec, Descriptor
from maskc.options import Options
from maskc.runtime import autotune
from maskc.runtime.launch import PackedLaunch
from maskc.runtime.permute import from_order_all, ordered_for, to_order_all
from maskc.runtime.loader import disk_cache, resolved_options
from maskc.runtime.state import (StoredWords, backward_kernel, can_store, capability, device_descriptor, device_turns,
                                 l2_bytes, prepared, refresh, sm_count, state_for, stored_words)
from maskc.runtime.operands import (AttentionInputError, Operand, Outputs, check_layout, check_pointers, check_scale,
                                    float32_rows, on_device, operand, operand_key, validate)
from maskc.runtime.tma import tile_map

__all__ = ["attention", "attention_backward"]



# ---- the entry points -----------------------------------------------------------------------------------


@dataclass
class _ForwardCall:
    """Everything about a forward call but its data: made once per bound mask and input layout."""
    launch: PackedLaunch    # data pointers (and tensor maps) rewritten per call
    out_shape: tuple
    lse_shape: tuple
    tensor_maps: tuple | None   # (rows per box) of q, k, v when the kernel takes tensor maps, else None
    slots: dict                 # kernel parameter name -> its position (maskc.codegen.plan), for per-call arguments
    views: tuple                # the descriptor views it reads: ((block_m, block_n, transposed),)
    stored: StoredWords | None = None   # the stored path's words (ForwardPlan.stored)
    schedules: dict = field(default_factory=dict)   # stream -> the persistent kernel's work counter (int32[2])

    def schedule(self, stream: int) -> int:
        """The device address of this stream's work counter: launches on one stream run one after the other,
        and each resets its counter when it is done, so the next finds it at zero."""
        counter = self.schedules.get(stream)
        if counter is None:
            import cupy

            counter = self.schedules[stream] = cupy.zeros(2, np.int32)
            cupy.cuda.get_current_stream().synchronize()   # zeroed before any stream's kernel reads it
        return counter.data.ptr


def _l2_heads(ko: Operand, mask_batch: int, pairs: int, device: int) -> int:
    """How many (batch, head) pairs' K and V fit in most of the L2 at once, a power of two (at least 1, at
    most ``pairs``): the persistent kernel takes work items section by section of that many pairs."""
    _, Hkv, Skv, D = ko.shape
    group = max(1, pairs // max(1, Hkv))            # query heads that read one kv head
    bytes_per_pair = 2 * Skv * D * 2 * mask_batch / group
    budget = 0.8 * l2_bytes(device)
    fit = max(1, int(budget // max(1.0, bytes_per_pair)))
    return max(1, min(pairs, 1 << (fit.bit_length() - 1)))


def _front(desc, pairs: int, section_pairs: int, device: int, options: Options, transposed: bool = False) -> int:
    """The rows (columns, ``transposed``) of the view's work order that a launch in L2 sections takes for every pair
    first (:meth:`Descriptor.front`); 0 where the options say so, and for a descriptor built on the device (its
    costs stay there)."""
    if not options.long_rows_first or not isinstance(desc, Descriptor):
        return 0
    return desc.front(pairs, section_pairs, sm_count(device), transposed)


def _l2_section_heads(heads: int, bytes_per_head: int, device: int) -> int:
    """How many heads the backward's grids take at a time (at least 1, at most ``heads``): as many as most of
    the L2 holds the per-head bytes of."""
    return max(1, min(heads, int(0.8 * l2_bytes(device) // max(1, bytes_per_head))))


def attention(q, k, v, bound, scale: float | None = None, return_lse: bool = False, *,
              options: Options | None = None):
    """Masked attention forward: softmax(scale * Q K^T + mask) V for the mask ``bound``.

    q: (B, Hq, S, D), k and v: (B, Hkv, Skv, D), torch CUDA tensors or CuPy arrays, bf16 or fp16, any
    strides with the last dim contiguous. Returns O (B, Hq, S, D) in the input's type and dtype, and with
    ``return_lse`` also LSE float32 (B, Hq, S) (natural log; -inf for a row that sees no key, whose O is 0).
    ``options`` (default: the environment's): ``tiles`` overrides the schedule's (block_m, block_n,
    num_warps[, engine]) (benchmarks; engine "mma" when not given), ``engine`` its engine; ``autotune``
    times the candidates on these inputs the first time and reuses the fastest (maskc.runtime.autotune).
    """
    options = resolved_options(options, "attention()")
    ordered = ordered_for(bound, options, q, k)
    if ordered is not None:         # a token order (maskc.ordered): the call in it, the results back in raster
        qp, kp, vp = to_order_all((q, k, v), ordered, options)
        found = attention(qp, kp, vp, ordered.inner, scale, return_lse, options=options)
        back = from_order_all(found if return_lse else (found,), ordered, options)
        return back if return_lse else back[0]
    qo, ko, vo = operand(q, "q"), operand(k, "k"), operand(v, "v")
    # Everything the plan depends on besides the bound mask (whose state holds the plans).
    key = ("forward", operand_key(qo, ko, vo), scale, bool(return_lse), options)
    state = state_for(bound)
    call = state.get(key)
    if call is None:
        call = state[key] = _forward_call(q, k, v, qo, ko, vo, bound, scale, options)
    check_pointers(qo, ko, vo)
    with on_device(qo.device):
        outs = Outputs(qo)
        o, o_ptr = outs.empty(call.out_shape)
        lse, lse_ptr = outs.empty(call.lse_shape, fp32=True) if return_lse else (None, 0)
        index = call.slots.__getitem__
        maps: list = []
        pointers = [(index(n), ptr) for n, ptr in zip(POINTERS, (qo.ptr, ko.ptr, vo.ptr, o_ptr, lse_ptr))]
        if call.tensor_maps is not None:
            maps = [(index(name), tile_map(op.ptr, op.shape, op.strides, rows))
                    for name, op, rows in zip(TENSOR_MAPS, (qo, ko, vo), call.tensor_maps)]
            pointers.append((index("schedule"), call.schedule(outs.stream)))
        refresh(bound, call.views, outs.stream)
        if call.stored is not None:
            call.stored.ready_on(outs.stream)
        call.launch(outs.stream, pointers, maps)
        outs.synchronize_if_asked(options)
    return (o, lse) if return_lse else o


def _forward_call(q, k, v, qo: Operand, ko: Operand, vo: Operand, bound, scale, options: Options) -> _ForwardCall:
    """Validate the inputs' layout against the bound mask, choose (or tune) the tiles, compile or fetch the
    kernel, upload the descriptor, and pack the launch's arguments (data pointers left 0)."""
    validate(qo, ko, vo, bound)
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    scale = check_scale(scale, D)
    tiles = options.tiles
    if options.autotune:
        tiles = _tuned_tiles(q, k, v, qo, bound, scale, options)
    if tiles is None:
        try:
            tiles = choose_tiles(D, qo.dtype, capability(qo.device, options), engine=options.engine,
                                 table_regions=bound.mask.table_regions)
        except ValueError as exc:
            raise AttentionInputError(f"tiles: {exc}") from None

    with on_device(qo.device):
        ddesc, kernel = prepared(bound, D, qo.dtype, tiles, qo.device, options)
        desc, plan = ddesc.descriptor, kernel.source.plan
        if (desc.seq_len, desc.kv_len) != (S, Skv) or desc.batch not in (1, B):
            raise RuntimeError(f"descriptor sizes {desc.batch}x{desc.seq_len}x{desc.kv_len} do not match inputs")
        n_work = int(desc.work_order.size)
        batch_grid = B if desc.batch == 1 else 1
        i64, i32, u64 = np.int64, np.int32, np.uint64
        values = {name: u64(0) for name in POINTERS}          # set per call
        for prefix, op in (("q", qo), ("k", ko), ("v", vo)):
            values.update({f"{prefix}_s{axis}": i64(s) for axis, s in zip("bhs", op.strides[:3])})
        values.update({f"o_s{axis}": i64(s) for axis, s in zip("bhs", (Hq * S * D, S * D, D))})
        values.update(num_heads=i32(Hq), num_kv_heads=i32(Hkv), seq_len=i32(S), kv_len=i32(Skv),
                      mask_batch=i32(desc.batch), run_offsets=ddesc.run_offsets, runs=ddesc.runs,
                      work_order=ddesc.work_order, mask_data=ddesc.mask_data, mask_offsets=ddesc.mask_offsets,
                      scale_log2=np.float32(scale * math.log2(math.e)))
        stored = None
        if plan.stored:     # the PARTIAL tiles' visibility words, built once per bound mask
            stored = stored_words(bound, kernel, tiles.block_m, tiles.block_n, qo.device, options, Outputs(qo).stream)
            values["run_slots"], values["tile_words"] = stored.slots, stored.words
        grid = (n_work * Hq, batch_grid, 1)
        tensor_maps = None
        if "q_map" in {p.name for p in plan.params}:
            # the warp-specialized kernel: tensor maps (set per call: they hold the data pointers), a
            # persistent grid of one CTA per SM taking work items from a counter (one per stream, set per
            # call), and the number of heads whose K and V share L2 (the item order's sections)
            pairs = Hq * batch_grid
            tensor_maps = (plan.spec.block_m, plan.spec.block_n, plan.spec.block_n)
            for name, op, rows in zip(TENSOR_MAPS, (qo, ko, vo), tensor_maps):
                values[name] = tile_map(op.ptr, op.shape, op.strides, rows)
            l2_heads = _l2_heads(ko, desc.batch, pairs, qo.device)
            values.update(batch_grid=i32(batch_grid), n_work=i32(n_work), l2_heads=i32(l2_heads),
                          front_rows=i32(_front(desc, pairs, l2_heads, qo.device, options)), schedule=u64(0))
            grid = (min(n_work * pairs, sm_count(qo.device)), 1, 1)
        args = tuple(values[p.name] for p in plan.params)
        packed = PackedLaunch(kernel.function, args, grid, (plan.threads, 1, 1), kernel.shared_bytes)
    slots = {p.name: i for i, p in enumerate(plan.params)}
    return _ForwardCall(packed, (B, Hq, S, D), (B, Hq, S), tensor_maps, slots, ((tiles.block_m, tiles.block_n, False),),
                        stored)


def _tuned_tiles(q, k, v, qo: Operand, bound, scale: float, options: Options) -> Tiles:
    """The autotuner's choice for these inputs' key: from its cache, else measured now on these inputs."""
    import cupy

    D = qo.shape[3]
    # Once per bound mask and shape: the key renders the predicate, too slow to redo on every call.
    state = state_for(bound)
    disk = disk_cache(options)
    memo = ("tuned", D, qo.dtype, qo.device, str(disk.root))
    if memo in state:
        return state[memo]
    gpu = cupy.cuda.runtime.getDeviceProperties(qo.device)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    key = autotune.tuning_key(bound, D, qo.dtype, gpu)
    tuned = autotune.cache_for(disk)
    chosen = tuned.get(key)
    if chosen is not None:
        state[memo] = chosen
        return chosen
    device = cupy.cuda.Device(qo.device)

    def run(tiles):
        return attention(q, k, v, bound, scale, options=options.replace(autotune=False, tiles=tiles))

    def agrees(out, ref) -> bool:
        if qo.framework == "torch":
            a, b = out.float(), ref.float()
            return bool((a - b).norm() <= autotune.AGREEMENT * b.norm())
        a, b = out.astype(cupy.float32), ref.astype(cupy.float32)
        return bool(cupy.linalg.norm(a - b) <= autotune.AGREEMENT * cupy.linalg.norm(b))

    def measure(tiles, reps: int = 10) -> float:
        run(tiles)
        device.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            run(tiles)
        device.synchronize()
        return (time.perf_counter() - start) * 1e3 / reps

    candidates = forward_candidates(D, qo.dtype, capability(qo.device, options))
    chosen, report = autotune.pick(candidates, run, agrees, measure)
    tuned.put(key, chosen, report)
    state[memo] = chosen
    return chosen


def attention_backward(dout, q, k, v, out, lse, bound, scale: float | None = None, dlse=None,
                       deterministic: bool = False, *, options: Options | None = None):
    """Gradients of :func:`attention`: (dQ, dK, dV) for the output gradient ``dout``.

    ``out`` and ``lse`` are the forward's O and LSE (``return_lse=True``); ``dlse`` is an optional gradient
    of LSE (B, Hq, S) float32. dK and dV are summed over each GQA group. ``deterministic``: bitwise repeatable
    gradients, somewhat slower (on wgmma_tma the CTAs add dQ in a fixed order; on the other engines a query-major
    kernel computes dQ without atomics). Head dims 64
    and 128. ``options`` (default: the environment's): the dK/dV engine, its dQ reduction, the target.
    Returns arrays of the inputs' type and dtype, contiguous.
    """
    options = resolved_options(options, "attention_backward()")
    ordered = ordered_for(bound, options, q, k)
    if ordered is not None:         # the forward's token order: every input in it, the gradients back in raster
        dp, qp, kp, vp, op, lp, dlp = to_order_all((dout, q, k, v, out, lse, dlse), ordered, options)
        grads = attention_backward(dp, qp, kp, vp, op, lp, ordered.inner, scale, dlp, deterministic, options=options)
        return from_order_all(grads, ordered, options)
    qo, ko, vo = operand(q, "q"), operand(k, "k"), operand(v, "v")
    oo, do = operand(out, "out"), operand(dout, "dout")
    key = ("backward", operand_key(qo, ko, vo, oo, do), scale, bool(deterministic), options)
    state = state_for(bound)
    planned = state.get(key)
    if planned is None:
        planned = state[key] = _backward_plan(qo, ko, vo, oo, do, bound, scale, deterministic, options)
    plan, views, stored = planned
    check_pointers(qo, ko, vo, oo, do)
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    lse_ptr = float32_rows(lse, "lse", qo, (B, Hq, S))
    dlse_ptr = float32_rows(dlse, "dlse", qo, (B, Hq, S)) if dlse is not None else 0

    with on_device(qo.device):
        outs = Outputs(qo)
        dq, dq_ptr = outs.empty((B, Hq, S, D))
        dk, dk_ptr = outs.empty((B, Hkv, Skv, D))
        dv, dv_ptr = outs.empty((B, Hkv, Skv, D))
        # rows padded to whole 64-row query blocks (the template's ROW_PAD): the copy engine reads a step's LSE
        # and delta in one aligned piece, and the bulk_tile reduction lays dQ out in blocks
        padded = -(-S // ROW_PAD) * ROW_PAD
        # LSE (log2) and delta in one allocation: two (B, Hq, padded) halves, each 256-byte aligned
        row_stats, lse_log2_ptr = outs.empty((2, B, Hq, padded), fp32=True)
        delta_ptr = lse_log2_ptr + B * Hq * padded * 4
        accumulated = not deterministic or _takes_turns(plan)    # dQ through the fp32 buffer
        # both zeroed by the prep kernel, in its pass over the rows
        dq_accum, dq_accum_ptr = outs.empty((B, Hq, padded, D), fp32=True) if accumulated else (None, 0)
        # the deterministic wgmma_tma kernel: how many additions each (b, h, 64-row query block) of dQ has had
        dq_turns, dq_turns_ptr = outs.empty((B, Hq, padded // ROW_PAD), int32=True) if _takes_turns(plan) \
            else (None, 0)
        pointers = {"q": qo.ptr, "k": ko.ptr, "v": vo.ptr, "out": oo.ptr, "dout": do.ptr, "lse": lse_ptr,
                    "dlse": dlse_ptr, "lse_log2": lse_log2_ptr, "delta": delta_ptr, "dq": dq_ptr, "dk": dk_ptr,
                    "dv": dv_ptr, "dq_accum": dq_accum_ptr, "dq_turns": dq_turns_ptr}
        operands = {"q": qo, "k": ko, "v": vo, "dout": do}
        refresh(bound, views, outs.stream)
        if stored is not None:
            stored.ready_on(outs.stream)
        for step in plan:
            maps = [(index, tile_map(operands[name].ptr, operands[name].shape, operands[name].strides, rows))
                    for index, name, rows in step.maps]
            step.launch(outs.stream, [(index, pointers[name]) for index, name in step.pointers], maps)
        outs.synchronize_if_asked(options)
        del dq_accum, dq_turns, row_stats   # the stream orders their reuse (the pools are stream-aware)
    return dq, dk, dv


def _takes_turns(plan: list[_BackwardLaunch]) -> bool:
    """Whether the plan's dK/dV kernel adds dQ in turns (the deterministic wgmma_tma one): it sets dq_turns."""
    return any(name == "dq_turns" for step in plan for _, name in step.pointers)


class _BackwardLaunch(NamedTuple):
    """One packed backward launch and what each call sets in it: ``pointers`` ((argument index, buffer name),
    ...) and ``maps`` ((argument index, operand name, box rows), ...: tensor maps of the call's operands)."""

    launch: PackedLaunch
    pointers: tuple[tuple[int, str], ...]
    maps: tuple[tuple[int, str, int], ...] = ()


def _backward_plan(qo: Operand, ko: Operand, vo: Operand, oo: Operand, do: Operand, bound, scale,
                   deterministic: bool, options: Options
                   ) -> tuple[list[_BackwardLaunch], tuple, StoredWords | None]:
    """Validate, compile or fetch the backward kernels, upload the descriptor's views, and pack the launches in
    launch order (prep, dK/dV, then dQ's conversion or deterministic kernel); with the views they read and the
    stored path's words (None off it)."""
    validate(qo, ko, vo, bound)
    for op in (oo, do):
        check_layout(op)
        if op.shape != qo.shape or op.dtype != qo.dtype or op.framework != qo.framework or op.device != qo.device:
            raise AttentionInputError(f"{op.name} must match q: shape {qo.shape}, dtype {qo.dtype}, same device "
                                      f"and framework; got {op.shape}, {op.dtype}")
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    scale = check_scale(scale, D)
    try:
        tiles = choose_backward_tiles(D, qo.dtype, capability(qo.device, options), engine=options.backward_engine)
    except ValueError as exc:
        raise AttentionInputError(str(exc)) from None
    block_m, block_n, dq_block_n = tiles.block_m, tiles.block_n, tiles.dq_block_n

    with on_device(qo.device):
        cols = device_descriptor(bound, block_m, block_n, qo.device, options, transposed=True)
        if options.partial_tiles in AUTO_STORED and not can_store(cols.descriptor, options, transposed=True):
            options = options.replace(partial_tiles="bits")
        kernel = backward_kernel(bound, tiles, D, qo.dtype, qo.device, options)
        spec = kernel.source.spec
        assert isinstance(spec, BackwardSpec)
        mask_batch = cols.descriptor.batch
        i64, i32, u64, f32 = np.int64, np.int32, np.uint64, np.float32
        strides = lambda op: tuple(i64(s) for s in op.strides[:3])   # noqa: E731
        batch_grid = B if mask_batch == 1 else 1
        rows = B * Hq * (-(-S // ROW_PAD) * ROW_PAD)      # the prep kernel writes the padding rows too
        fns, kernel_plan = kernel.functions, kernel.source.plan
        assert isinstance(kernel_plan, BackwardPlan)      # a backward source carries its plan
        scales = (f32(scale), f32(scale * math.log2(math.e)))
        common = (*strides(qo), *strides(ko), *strides(vo), *strides(do), i32(Hq), i32(Hkv), i32(S), i32(Skv),
                  i32(mask_batch))
        # heads per L2 section: what the CTAs resident together read over and over (per kv head: its group's Q,
        # dO and fp32 dQ rows for dK/dV; K and V for the deterministic dQ kernel) should stay in L2
        group = Hq // Hkv
        dkdv_sections = _l2_section_heads(Hkv, mask_batch * group * S * (D * (2 + 2 + 4) + 8), qo.device)
        dq_sections = _l2_section_heads(Hq, mask_batch * 2 * Skv * D * 2, qo.device)

        def packed(entry, names, rest, grid, block, maps=(), late=()):
            """A kernel whose pointer arguments (``names``) come first, then ``rest``, then the pointers ``late``
            and the tensor maps of ``maps`` ((operand, box rows)); pointers and maps are set per call (they hold
            the data addresses)."""
            operands = {"q": qo, "k": ko, "v": vo, "dout": do}
            first_late = len(names) + len(rest)
            args = (tuple(u64(0) for _ in names) + rest + tuple(u64(0) for _ in late)
                    + tuple(tile_map(operands[n].ptr, operands[n].shape, operands[n].strides, r) for n, r in maps))
            first_map = first_late + len(late)
            return _BackwardLaunch(PackedLaunch(fns[entry], args, grid, block, kernel.shared[entry]),
                                   tuple(enumerate(names)) + tuple((first_late + i, n) for i, n in enumerate(late)),
                                   tuple((first_map + i, n, r) for i, (n, r) in enumerate(maps)))

        # prep: out, dout, lse, dlse, the strides of out and dout, then lse_log2 and delta, and the buffers it zeroes
        prep = PackedLaunch(fns[spec.entry_prep], (
            u64(0), u64(0), u64(0), u64(0), *strides(oo), *strides(do), u64(0), u64(0), u64(0), u64(0), i32(Hq),
            i32(S), i64(rows)), ((rows + 7) // 8, 1, 1), (256, 1, 1), 0)
        plan = [_BackwardLaunch(prep, ((0, "out"), (1, "dout"), (2, "lse"), (3, "dlse"), (10, "lse_log2"),
                                       (11, "delta"), (12, "dq_accum"), (13, "dq_turns")))]
        warp_specialized = spec.engine == "wgmma_tma"
        # the deterministic mode on wgmma_tma: dQ added in turns (columns shortest first), else by its own kernel;
        # a mask bound on the device (maskc.DeviceMask) has no turns (the host orders them): its own kernel
        in_turns = (deterministic and spec.dq_in_turns and options.deterministic_dq == "turns"
                    and not hasattr(bound, "build_views"))
        entry = spec.entry_dkdv_ordered if in_turns else spec.entry_dkdv_det if deterministic else spec.entry_dkdv
        if in_turns:        # more heads per section where a section would not outlast the longest chain of turns
            assert isinstance(cols.descriptor, Descriptor)       # turns are the host's (not a DeviceMask's)
            dkdv_sections = cols.descriptor.turn_sections(Hkv, dkdv_sections, sm_count(qo.device), group)
        # "wave": the CTAs of the grid's first wave (one per SM, dkdv_sections kv heads to a column) shortest first
        first_wave = -(-sm_count(qo.device) // dkdv_sections) if options.dq_turn_order == "wave" else None
        order, rank_base, ranks = (device_turns(bound, block_m, block_n, qo.device, options, first_wave) if in_turns
                                   else (cols.work_order, None, None))
        maps = (("q", block_m), ("k", block_n), ("v", block_n), ("dout", block_m)) if warp_specialized else ()
        # wgmma_tma's rank_base, ranks and dq_turns (set per call when it takes turns, else null), after the stored
        # path's column slots and words
        turns = ((rank_base, ranks) if in_turns else (u64(0),) * 3) if warp_specialized else ()
        stored = None
        if spec.partial_tiles == "stored":
            stored = stored_words(bound, kernel, block_m, block_n, qo.device, options, Outputs(qo).stream,
                                  transposed=True)
            turns = (stored.slots, stored.words) + turns
        # the longest columns first for every head where they would end well after the sections (not in turns:
        # their order is the turns')
        front = 0 if in_turns else _front(cols.descriptor, Hkv * batch_grid, dkdv_sections, qo.device, options,
                                           transposed=True)
        plan.append(packed(entry, ("q", "k", "v", "dout", "lse_log2", "delta", "dk", "dv", "dq_accum"), (
            *common, i32(dkdv_sections), i32(front), cols.run_offsets, cols.runs, order, cols.mask_data,
            cols.mask_offsets, *scales, *turns), (int(cols.work_order.size) * Hkv, batch_grid, 1),
            (kernel_plan.dkdv_threads, 1, 1), maps, late=("dq_turns",) if in_turns else ()))
        if deterministic and not in_turns:
            rows_view = device_descriptor(bound, block_m, dq_block_n, qo.device, options)
            plan.append(packed(spec.entry_dq, ("q", "k", "v", "dout", "lse_log2", "delta", "dq"), (
                *common, i32(dq_sections), rows_view.run_offsets, rows_view.runs, rows_view.work_order, rows_view.mask_data,
                rows_view.mask_offsets, *scales), (int(rows_view.work_order.size) * Hq, batch_grid, 1),
                (block_m // 16 * 32, 1, 1)))
        else:
            n = B * Hq * S * D
            plan.append(packed(spec.entry_dq_convert, ("dq_accum", "dq"), (f32(scale), i64(n), i32(S)),
                               ((n // 2 + 255) // 256, 1, 1), (256, 1, 1)))
    views = ((block_m, block_n, True),) + (((block_m, dq_block_n, False),) if deterministic and not in_turns else ())
    return plan, views, stored
