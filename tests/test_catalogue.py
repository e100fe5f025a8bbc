"""attention-gym's catalogue in .mask (issue 19's target: every mask_mod expressible, equal cell for cell, with
tiles exact or within 5% excess PARTIAL).

The functions of attention-gym's attn_gym/masks and attn_gym/mods (meta-pytorch/attention-gym at GYM_COMMIT) are
transcribed below into numpy from their source, line for line where it matters (torch's clamp, floor division
and modulo are numpy's for these integers), independently of maskc. Each is paired with the .mask that expresses
it (an example, or a mask of tests/catalogue/ named after the function) and checked cell for cell, for every head
and batch element, at several parameter values and lengths, ragged ones among them; then its tiles are measured
with bench/tile_excess.py's measure (maskc.audit.audit_tiles) at the kernels' tile shapes. Score mods are checked
against maskc's score reference (``bound.modified_scores``). docs/language/catalogue.md is the table, with what
the language cannot write yet.
"""
from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import maskc
from maskc.audit import audit_tiles
from maskc.lint import lint_file

from conftest import EXAMPLES, ROOT

CATALOGUE = ROOT / "tests" / "catalogue"
GYM_COMMIT = "7fdb85d0b96668397adee48de54b6f1036497717"
TILES = ((128, 128), (64, 64), (128, 80), (192, 128))      # bench/tile_excess.py's: the kernels' tile shapes
MAX_EXCESS = 0.05                                          # of the PARTIAL tiles, really FULL or EMPTY


# ---- attention-gym, in numpy: mask_mod(b, h, q_idx, kv_idx) on broadcasting int64 arrays ----------------------

def _clamp(x, lo, hi):
    """torch.clamp(x, lo, hi): max with lo, then min with hi (so hi when lo > hi)."""
    return np.minimum(np.maximum(x, lo), hi)


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def noop_mask(b, h, q_idx, kv_idx):
    return np.ones(np.broadcast(q_idx, kv_idx).shape, bool)


def and_masks(*mods):
    return lambda b, h, q, kv: functools.reduce(np.logical_and, [m(b, h, q, kv) for m in mods])


def or_masks(*mods):
    return lambda b, h, q, kv: functools.reduce(np.logical_or, [m(b, h, q, kv) for m in mods])


def generate_sliding_window(window_size):
    return and_masks(lambda b, h, q_idx, kv_idx: q_idx - kv_idx <= window_size, causal_mask)


def generate_prefix_lm_mask(prefix_length):
    return or_masks(lambda b, h, q_idx, kv_idx: kv_idx < prefix_length, causal_mask)


def length_to_offsets(lengths):
    return np.cumsum([0] + list(lengths))


def _offsets_to_doc_ids(offsets):
    counts = offsets[1:] - offsets[:-1]
    return np.repeat(np.arange(len(counts)), counts)


def generate_doc_mask_mod(mask_mod, offsets):
    document_id = _offsets_to_doc_ids(offsets)

    def doc_mask_mod(b, h, q_idx, kv_idx):
        same_doc = document_id[q_idx] == document_id[kv_idx]
        q_logical = q_idx - offsets[document_id[q_idx]]
        kv_logical = kv_idx - offsets[document_id[kv_idx]]
        return same_doc & mask_mod(b, h, q_logical, kv_logical)
    return doc_mask_mod


def generate_packed_causal_doc_mask_mod(offsets):
    document_id = _offsets_to_doc_ids(offsets)
    return lambda b, h, q_idx, kv_idx: (kv_idx >= offsets[document_id[q_idx]]) & causal_mask(b, h, q_idx, kv_idx)


def batchify_mask_mod(mask_mod, batchify_size):
    def batched_mask_mod(b, h, q_idx, kv_idx):
        same_batch = q_idx // batchify_size == kv_idx // batchify_size
        return same_batch & mask_mod(b, h, q_idx % batchify_size, kv_idx % batchify_size)
    return batched_mask_mod


def generate_block_diffusion_mask(seq_len, block_size):
    def block_diffusion_mask(b, h, q_idx, kv_idx):
        q_noised, kv_noised = q_idx < seq_len, kv_idx < seq_len
        q_block, kv_block = (q_idx % seq_len) // block_size, (kv_idx % seq_len) // block_size
        block_diagonal = (q_block == kv_block) & (q_noised == kv_noised)
        offset_block_causal = (q_block > kv_block) & q_noised & ~kv_noised
        block_causal = (q_block >= kv_block) & ~q_noised & ~kv_noised
        return block_diagonal | offset_block_causal | block_causal
    return block_diffusion_mask


def generate_dilated_sliding_window(window_size, dilation):
    def dilated_sliding_window(b, h, q_idx, kv_idx):
        diff = np.abs(q_idx - kv_idx)
        return (diff <= window_size) & (diff % dilation == 0)
    return dilated_sliding_window


def generate_vision_cross_attention_mask_mod(intervals, image_token_length):
    intervals = np.asarray(intervals)
    image_boundaries = np.repeat(np.arange(intervals.shape[0]), image_token_length)

    def vision_cross_attention_mask_mod(b, h, q_idx, kv_idx):
        interval = intervals[image_boundaries[kv_idx]]
        return (q_idx >= interval[..., 0]) & (q_idx < interval[..., 1])
    return vision_cross_attention_mask_mod


def generate_global_sliding_window(window_size, is_global):
    is_global = np.asarray(is_global, bool)
    return or_masks(lambda b, h, q_idx, kv_idx: np.abs(q_idx - kv_idx) <= window_size,
                    lambda b, h, q_idx, kv_idx: is_global[q_idx] | is_global[kv_idx])


def build_tree_ancestor_matrix(parent_indices):
    ancestor_matrix = np.eye(len(parent_indices), dtype=bool)
    for node, parent in enumerate(parent_indices[1:], start=1):
        ancestor_matrix[node] |= ancestor_matrix[parent]
    return ancestor_matrix


def generate_jetspec_tree_causal_mask_mod(prefix_length, ancestor_matrix):
    num_tree_nodes = ancestor_matrix.shape[0]
    tree_stop = prefix_length + num_tree_nodes

    def jetspec_tree_causal_mask_mod(b, h, q_idx, kv_idx):
        tree_idx = _clamp(kv_idx - prefix_length, 0, num_tree_nodes - 1)
        tree_visible = (kv_idx >= prefix_length) & (kv_idx < tree_stop)
        return (kv_idx < prefix_length) | (tree_visible & ancestor_matrix[q_idx, tree_idx])
    return jetspec_tree_causal_mask_mod


def generate_jetspec_training_mask_mod(prefix_length, block_size):
    def jetspec_training_mask_mod(b, h, q_idx, kv_idx):
        q_block, q_block_offset = q_idx // block_size, q_idx % block_size
        kv_block_idx = kv_idx - prefix_length
        kv_block, kv_block_offset = kv_block_idx // block_size, kv_block_idx % block_size
        same_block_causal = (kv_idx >= prefix_length) & (q_block == kv_block) & (kv_block_offset <= q_block_offset)
        return (kv_idx < prefix_length) | same_block_causal
    return jetspec_training_mask_mod


def generate_natten(canvas_w, canvas_h, kernel_w, kernel_h):
    def natten_mask_mod(b, h, q_idx, kv_idx):
        q_x, q_y = q_idx // canvas_w, q_idx % canvas_w
        kv_x, kv_y = kv_idx // canvas_w, kv_idx % canvas_w
        kernel_center_x = _clamp(q_x, kernel_w // 2, (canvas_w - 1) - kernel_w // 2)
        kernel_center_y = _clamp(q_y, kernel_h // 2, (canvas_h - 1) - kernel_h // 2)
        hori_mask = np.abs(kernel_center_x - kv_x) <= kernel_w // 2
        vert_mask = np.abs(kernel_center_y - kv_y) <= kernel_h // 2
        return hori_mask & vert_mask
    return natten_mask_mod


def generate_tiled_natten(W, H, K_W, K_H, T_W, T_H):
    def get_x_y_tiled(idx):
        t_id = idx // (T_H * T_W)
        t_y, t_x = t_id // (W // T_W), t_id % (W // T_W)
        t_offset = idx % (T_H * T_W)
        i_y, i_x = t_offset // T_W, t_offset % T_W
        return t_x * T_W + i_x, t_y * T_H + i_y

    def tiled_natten_mask(b, h, q_idx, kv_idx):
        (q_x, q_y), (kv_x, kv_y) = get_x_y_tiled(q_idx), get_x_y_tiled(kv_idx)
        kernel_x = _clamp(q_x, K_W // 2, (W - 1) - K_W // 2)
        kernel_y = _clamp(q_y, K_H // 2, (H - 1) - K_H // 2)
        return (np.abs(kernel_x - kv_x) <= K_W // 2) & (np.abs(kernel_y - kv_y) <= K_H // 2)
    return tiled_natten_mask


def deinterleave_bits_32(code):
    code = code & 0x55555555
    code = (code | (code >> 1)) & 0x33333333
    code = (code | (code >> 2)) & 0x0F0F0F0F
    code = (code | (code >> 4)) & 0x00FF00FF
    return (code | (code >> 8)) & 0x0000FFFF


def generate_morton_natten(canvas_w, canvas_h, kernel_w, kernel_h):
    def natten_mask_mod(b, h, q_idx, kv_idx):
        q_x, q_y = deinterleave_bits_32(q_idx), deinterleave_bits_32(q_idx >> 1)
        kv_x, kv_y = deinterleave_bits_32(kv_idx), deinterleave_bits_32(kv_idx >> 1)
        kernel_center_x = _clamp(q_x, kernel_w // 2, (canvas_w - 1) - kernel_w // 2)
        kernel_center_y = _clamp(q_y, kernel_h // 2, (canvas_h - 1) - kernel_h // 2)
        return (np.abs(kernel_center_x - kv_x) <= kernel_w // 2) & (np.abs(kernel_center_y - kv_y) <= kernel_h // 2)
    return natten_mask_mod


def generate_shared_prefix_mask_mod(offsets, prefix_document_id):
    document_id = _offsets_to_doc_ids(offsets)
    prefix_document_id = np.asarray(prefix_document_id)

    def shared_prefix_mask_mod(b, h, q_idx, kv_idx):
        q_document = document_id[q_idx]
        q_prefix_document = prefix_document_id[q_document]
        same_document_causal = (kv_idx >= offsets[q_document]) & causal_mask(b, h, q_idx, kv_idx)
        prefix_document = ((q_document != q_prefix_document) & (kv_idx >= offsets[q_prefix_document])
                           & (kv_idx < offsets[q_prefix_document + 1]))
        return same_document_causal | prefix_document
    return shared_prefix_mask_mod


def _sta_border(kernel_size):
    return kernel_size // 2, kernel_size // 2 + (kernel_size % 2 - 1)


def generate_sta_mask_mod_2d(canvas_hw, kernel_hw, tile_hw, text_seq_len=0):
    (canvas_h, canvas_w), (kernel_h, kernel_w), (tile_h, tile_w) = canvas_hw, kernel_hw, tile_hw
    assert canvas_h % tile_h == 0 and canvas_w % tile_w == 0 and kernel_h % tile_h == 0 and kernel_w % tile_w == 0
    canvas_tile_h, canvas_tile_w = canvas_h // tile_h, canvas_w // tile_w
    kernel_tile_h, kernel_tile_w = kernel_h // tile_h, kernel_w // tile_w
    vision_seq_len = canvas_h * canvas_w

    def get_h_w_idx_tiled(idx):
        tile_id = idx // (tile_h * tile_w)
        return tile_id // canvas_tile_w, tile_id % canvas_tile_w

    def sta_mask_mod_2d(b, h, q_idx, kv_idx):
        (q_tile_h, q_tile_w), (kv_tile_h, kv_tile_w) = get_h_w_idx_tiled(q_idx), get_h_w_idx_tiled(kv_idx)
        (left_h, right_h), (left_w, right_w) = _sta_border(kernel_tile_h), _sta_border(kernel_tile_w)
        center_h = _clamp(q_tile_h, left_h, (canvas_tile_h - 1) - right_h)
        center_w = _clamp(q_tile_w, left_w, (canvas_tile_w - 1) - right_w)
        h_mask = (kv_tile_h >= center_h - left_h) & (kv_tile_h <= center_h + right_h)
        w_mask = (kv_tile_w >= center_w - left_w) & (kv_tile_w <= center_w + right_w)
        vision_mask = (q_idx < vision_seq_len) & (kv_idx < vision_seq_len)
        vision_to_text = ((q_idx < vision_seq_len) & (kv_idx >= vision_seq_len)
                          & (kv_idx < vision_seq_len + text_seq_len))
        text_to_all = (q_idx >= vision_seq_len) & (kv_idx < vision_seq_len + text_seq_len)
        return (vision_mask & h_mask & w_mask) | vision_to_text | text_to_all
    return sta_mask_mod_2d


def generate_sta_mask_mod_3d(canvas_twh, kernel_twh, tile_twh, text_seq_len=0):
    (canvas_t, canvas_h, canvas_w), (kernel_t, kernel_h, kernel_w), (tile_t, tile_h, tile_w) = \
        canvas_twh, kernel_twh, tile_twh
    ct, ch, cw = canvas_t // tile_t, canvas_h // tile_h, canvas_w // tile_w
    kt, kh, kw = kernel_t // tile_t, kernel_h // tile_h, kernel_w // tile_w
    vision_seq_len = canvas_t * canvas_h * canvas_w

    def get_t_h_w_idx_tiled(idx):
        tile_id = idx // (tile_t * tile_h * tile_w)
        return tile_id // (ch * cw), (tile_id % (ch * cw)) // cw, tile_id % cw

    def sta_mask_mod_3d(b, h, q_idx, kv_idx):
        q_t, q_h, q_w = get_t_h_w_idx_tiled(q_idx)
        kv_t, kv_h, kv_w = get_t_h_w_idx_tiled(kv_idx)
        masks = []
        for q_c, kv_c, k_c, c_c in ((q_t, kv_t, kt, ct), (q_h, kv_h, kh, ch), (q_w, kv_w, kw, cw)):
            left, right = _sta_border(k_c)
            center = _clamp(q_c, left, (c_c - 1) - right)
            masks.append((kv_c >= center - left) & (kv_c <= center + right))
        vision_mask = (q_idx < vision_seq_len) & (kv_idx < vision_seq_len)
        vision_to_text = ((q_idx < vision_seq_len) & (kv_idx >= vision_seq_len)
                          & (kv_idx < vision_seq_len + text_seq_len))
        text_to_all = (q_idx >= vision_seq_len) & (kv_idx < vision_seq_len + text_seq_len)
        return (vision_mask & masks[0] & masks[2] & masks[1]) | vision_to_text | text_to_all
    return sta_mask_mod_3d


def generate_spatial_head_mask_mod(prompt_length=226, num_frames=13, token_per_frame=1350, width=2, attn_sink=False,
                                   round_width=128):
    def spatial_mask_mod(b, h, q_idx, kv_idx):
        first_row_mask = q_idx < prompt_length
        first_column_mask = kv_idx < (prompt_length + token_per_frame if attn_sink else prompt_length)
        mask_width = math.floor(width * token_per_frame / round_width) * round_width
        return first_column_mask | first_row_mask | (np.abs(q_idx - kv_idx) < mask_width)
    return spatial_mask_mod


def generate_temporal_head_mask_mod(prompt_length=226, num_frames=13, token_per_frame=1350, width=2):
    def temporal_mask_mod(b, h, q_idx, kv_idx):
        mask_width = (width * token_per_frame) // num_frames
        q_token_id = (q_idx - prompt_length) % token_per_frame
        kv_token_id = (kv_idx - prompt_length) % token_per_frame
        return (kv_idx < prompt_length) | (q_idx < prompt_length) | (np.abs(q_token_id - kv_token_id) < mask_width)
    return temporal_mask_mod


def generate_vsa_mask_mod(topk_indices, tile_numel, variable_block_sizes=None):
    def vsa_mask_mod(b, h, q_idx, kv_idx):
        q_tile, kv_tile = q_idx // tile_numel, kv_idx // tile_numel
        selected_tiles = topk_indices[b, h, q_tile]
        selected = (selected_tiles == kv_tile[..., None]).any(axis=-1)
        if variable_block_sizes is None:
            return selected
        return selected & (kv_idx % tile_numel < variable_block_sizes[kv_tile])
    return vsa_mask_mod


def generate_vsa_block_map_mask_mod(block_map, tile_numel, variable_block_sizes=None):
    block_map = block_map.astype(bool)

    def vsa_block_map_mask_mod(b, h, q_idx, kv_idx):
        q_tile, kv_tile = q_idx // tile_numel, kv_idx // tile_numel
        selected = block_map[b, h, q_tile, kv_tile]
        if variable_block_sizes is None:
            return selected
        return selected & (kv_idx % tile_numel < variable_block_sizes[kv_tile])
    return vsa_block_map_mask_mod


def generate_vsa_padding_mask_mod(variable_block_sizes, tile_numel):
    return lambda b, h, q_idx, kv_idx: kv_idx % tile_numel < variable_block_sizes[kv_idx // tile_numel]


# attn_gym/mods: score_mod(score, b, h, q_idx, kv_idx)

def generate_alibi_bias(H):
    def alibi_mod(score, b, h, q_idx, kv_idx):
        return score + (kv_idx - q_idx) * np.exp2(-((h + 1) * 8.0 / H))
    return alibi_mod


def generate_tanh_softcap(soft_cap, approx=False):
    return lambda score, b, h, q_idx, kv_idx: soft_cap * np.tanh(score / soft_cap)


def sandwich_tables(H, max_seq_len, d_bar=128):
    """generate_sandwich_bias's precomputed tables (float32, as torch computes them): rel_bias, head_scale, offset."""
    freqs = (1.0 / 10000 ** (2 * np.arange(d_bar // 2, dtype=np.float32) / d_bar)).astype(np.float32)
    padded_len = -(-(2 * max_seq_len - 1) // 8) * 8
    distances = np.arange(padded_len, dtype=np.float32) - (max_seq_len - 1)
    rel_bias = np.cos(np.abs(distances)[:, None] * freqs).astype(np.float32).sum(axis=-1, dtype=np.float32)
    head_scale = (H / (8.0 * np.arange(1, H + 1, dtype=np.float32))).astype(np.float32)
    return rel_bias, head_scale, max_seq_len - 1


def generate_sandwich_bias(H, max_seq_len, d_bar=128):
    rel_bias, head_scale, offset = sandwich_tables(H, max_seq_len, d_bar)
    return lambda score, b, h, q_idx, kv_idx: score + rel_bias[q_idx - kv_idx + offset] * head_scale[h]


# ---- the catalogue: each mask_mod with the .mask that expresses it, and bindings to check ------------------------

@dataclass(frozen=True)
class Binding:
    params: dict                        # bind's keywords (seq_len, kv_len, num_heads and the mask's parameters)
    gym: Callable                       # attention-gym's mask_mod for these values (b=0 unless batch is given)
    batch: int = 1


@dataclass(frozen=True)
class Entry:
    function: str                       # attention-gym's function, as it is called
    source: str                         # the .mask that expresses it: examples/NAME.mask or catalogue FILE:MASK
    bindings: Callable[[np.random.Generator], list]

    def load(self):
        if ":" in self.source:
            path, name = self.source.split(":")
            return maskc.load(CATALOGUE / path, name)
        return maskc.load(EXAMPLES / self.source)


def _lengths(rng, total, parts):
    """``parts`` positive lengths adding up to ``total`` (parts <= total)."""
    cuts = np.sort(rng.choice(np.arange(1, total), parts - 1, replace=False)) if parts > 1 else []
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(int).tolist()


def _causal(rng):
    return [Binding({"seq_len": s, "kv_len": kv}, causal_mask) for s, kv in ((1, 1), (100, 100), (333, 333),
                                                                              (300, 517), (1000, 1000))]


def _sliding_window(rng):
    return [Binding({"seq_len": s, "window": w + 1}, generate_sliding_window(w))       # gym's window: q - k <= w
            for s, w in ((50, 0), (300, 7), (777, 128), (1500, 300))]


def _prefix_lm(rng):
    return [Binding({"seq_len": s, "prefix": p}, generate_prefix_lm_mask(p)) for s, p in ((1, 0), (300, 37),
                                                                                         (777, 256), (1500, 1000))]


def _documents(inner, **extra):
    def bindings(rng):
        out = []
        for s, n in ((7, 3), (300, 1), (300, 5), (1000, 12), (1500, 4)):
            lengths = _lengths(rng, s, n)
            values = {key: int(draw(rng)) for key, draw in extra.items()}
            out.append(Binding({"seq_len": s, "docs": lengths, **values},
                               inner(length_to_offsets(lengths), **values)))
        return out
    return bindings


def _batchify(inner):
    return lambda rng: [Binding({"seq_len": s, "size": n}, batchify_mask_mod(inner, n))
                        for s, n in ((50, 1), (300, 37), (777, 128), (1500, 200))]


def _block_diffusion(rng):
    return [Binding({"seq_len": s, "n": n, "block": bs}, generate_block_diffusion_mask(n, bs))
            for s, n, bs in ((2, 1, 1), (300, 150, 16), (258, 129, 7), (1000, 500, 128), (1536, 768, 64),
                             (900, 700, 33))]          # the last: the first 900 tokens of 2 x 700


def _dilated(rng):
    return [Binding({"seq_len": s, "window": w, "dilation": d}, generate_dilated_sliding_window(w, d))
            for s, w, d in ((24, 4, 2), (300, 17, 3), (777, 128, 1), (1500, 256, 5))]


def _flamingo(rng):
    out = [Binding({"seq_len": 12, "kv_len": 9, "img": 3, "intervals": [[0, 7], [1, 7], [7, 12]]},
                   generate_vision_cross_attention_mask_mod([[0, 7], [1, 7], [7, 12]], 3))]      # its docstring's
    for s, n, length in ((300, 3, 64), (777, 7, 100), (1000, 5, 256), (1500, 12, 64)):
        starts = np.sort(rng.integers(0, s, n))
        ends = np.append(starts[1:], s)                 # text after an image, up to the next image ...
        stretch = rng.random(n) < 0.3                   # ... or beyond it (overlapping intervals)
        ends = np.where(stretch, rng.integers(ends, s + 1), ends)
        intervals = np.stack([starts, ends], axis=1).tolist()
        out.append(Binding({"seq_len": s, "kv_len": n * length, "img": length, "intervals": intervals},
                           generate_vision_cross_attention_mask_mod(intervals, length)))
    return out


def _global_sliding_window(rng):
    out = []
    for s, w, g in ((16, 3, 2), (300, 7, 3), (1000, 64, 8), (1500, 256, 16)):
        flags = np.zeros(s, int)
        flags[rng.choice(s, g, replace=False)] = 1
        out.append(Binding({"seq_len": s, "window": w, "is_global": flags.tolist()},
                           generate_global_sliding_window(w, flags)))
    return out


def _jetspec_tree(rng):
    out = [Binding({"seq_len": 7, "kv_len": 7, "anc": build_tree_ancestor_matrix([-1, 0, 1, 1, 3, 3, 0]).astype(
        int).tolist()}, generate_jetspec_tree_causal_mask_mod(0, build_tree_ancestor_matrix([-1, 0, 1, 1, 3, 3, 0])))]
    for n, prefix, fan in ((64, 300, 64), (256, 1000, 6), (500, 77, 3), (1000, 1500, 12)):
        parents = [-1] + [int(rng.integers(max(0, i - fan), i)) for i in range(1, n)]
        anc = build_tree_ancestor_matrix(parents)
        out.append(Binding({"seq_len": n, "kv_len": prefix + n, "anc": anc.astype(int).tolist()},
                           generate_jetspec_tree_causal_mask_mod(prefix, anc)))
    return out


def _jetspec_training(rng):
    return [Binding({"seq_len": s, "kv_len": p + s, "prefix": p, "block": bs},
                    generate_jetspec_training_mask_mod(p, bs))
            for s, p, bs in ((12, 5, 4), (300, 45, 16), (777, 1000, 7), (1536, 500, 128))]


_NATTEN = ((36, 6, 6, 3, 3), (300, 15, 20, 5, 3), (1024, 32, 32, 7, 7), (1000, 40, 25, 4, 6), (1500, 30, 50, 13, 13))


def _natten(rng):
    return [Binding({"seq_len": s, "canvas_w": w, "canvas_h": h, "kernel_w": kw, "kernel_h": kh},
                    generate_natten(w, h, kw, kh)) for s, w, h, kw, kh in _NATTEN]


def _neighborhood(rng):
    """examples/neighborhood.mask is generate_natten for a square canvas of seq_len tokens and an odd kernel."""
    return [Binding({"seq_len": w * w, "width": w, "window": kw}, generate_natten(w, w, kw, kw))
            for w, kw in ((6, 3), (17, 5), (32, 7), (38, 13))]


def _tiled_natten(rng):
    return [Binding(dict(seq_len=s, W=w, H=h, K_W=kw, K_H=kh, T_W=tw, T_H=th),
                    generate_tiled_natten(w, h, kw, kh, tw, th))
            for s, w, h, kw, kh, tw, th in ((36, 6, 6, 3, 3, 2, 2), (256, 16, 16, 5, 5, 4, 4),
                                            (300, 18, 20, 5, 3, 3, 2), (1024, 32, 32, 7, 7, 8, 8),
                                            (1500, 40, 40, 9, 5, 8, 4))]


def _morton_natten(rng):
    return [Binding({"seq_len": s, "canvas_w": w, "canvas_h": h, "kernel_w": kw, "kernel_h": kh},
                    generate_morton_natten(w, h, kw, kh))
            for s, w, h, kw, kh in ((36, 6, 6, 3, 3), (256, 16, 16, 3, 3), (300, 16, 16, 3, 5), (1024, 32, 32, 5, 5),
                                    (4096, 64, 64, 7, 7))]


def _shared_prefix(rng):
    out = []
    lengths, prefix = [3, 2, 2, 2, 3, 2, 2, 2], [0, 0, 0, 0, 4, 4, 4, 4]       # its example's
    for s, groups in ((None, 0), (300, 3), (1000, 5), (1500, 2)):
        if s is not None:
            lengths = _lengths(rng, s, 3 * groups)
            prefix = [i // 3 * 3 for i in range(3 * groups)]                   # a prompt, then two responses
        offsets = length_to_offsets(lengths)
        out.append(Binding({"seq_len": int(offsets[-1]), "docs": lengths, "prefix_doc": prefix,
                            "offsets": offsets.tolist()}, generate_shared_prefix_mask_mod(offsets, prefix)))
    return out


def _sta_2d(rng):
    out = []
    for extra, (ch, cw), (kh, kw), (th, tw), text in (
            (0, (24, 24), (12, 12), (4, 4), 0), (0, (16, 24), (12, 8), (4, 4), 20),
            (7, (20, 24), (12, 9), (4, 3), 37), (50, (30, 40), (18, 24), (6, 8), 100)):
        s = ch * cw + text + extra           # past the video and the text: tokens that see and are seen by none
        out.append(Binding({"seq_len": s, "tile_t": 1, "tile_h": th, "tile_w": tw, "tiles_t": 1, "tiles_h": ch // th,
                            "tiles_w": cw // tw, "window_t": 1, "window_h": kh // th, "window_w": kw // tw,
                            "text": text},
                           generate_sta_mask_mod_2d((ch, cw), (kh, kw), (th, tw), text)))
    return out


def _sta_3d(rng):
    out = []
    for extra, canvas, kernel, tile, text in (
            (0, (6, 8, 8), (4, 4, 4), (2, 2, 2), 40), (0, (5, 12, 12), (3, 6, 9), (1, 3, 3), 0),
            (11, (4, 12, 12), (2, 8, 4), (2, 4, 2), 30), (0, (12, 12, 12), (6, 6, 6), (2, 2, 2), 0)):
        s = int(np.prod(canvas)) + text + extra
        params = {"seq_len": s, "text": text}
        for a, c, k, t in zip("thw", canvas, kernel, tile):
            params.update({f"tile_{a}": t, f"tiles_{a}": c // t, f"window_{a}": k // t})
        out.append(Binding(params, generate_sta_mask_mod_3d(canvas, kernel, tile, text)))
    return out


def _svg_spatial(rng):
    return [Binding({"seq_len": s, "prompt": p, "frame": f, "width": w, "sink": int(sink), "round": r},
                    generate_spatial_head_mask_mod(p, 10, f, w, sink, r))
            for s, p, f, w, sink, r in ((142, 2, 14, 2, True, 4), (300, 10, 20, 2, False, 8),
                                        (777, 26, 45, 3, True, 16), (1500, 226, 135, 2, False, 128))]


def _svg_temporal(rng):
    return [Binding({"seq_len": s, "prompt": p, "frames": n, "frame": f, "width": w},
                    generate_temporal_head_mask_mod(p, n, f, w))
            for s, p, n, f, w in ((142, 2, 10, 14, 2), (300, 10, 10, 28, 2), (777, 26, 4, 45, 1),
                                  (1576, 226, 10, 135, 2))]


def _vsa_inputs(rng, s, kv, tile, heads, top_k, batch, padded):
    q_tiles, kv_tiles = -(-s // tile), -(-kv // tile)
    topk = np.stack([[[rng.choice(kv_tiles, top_k, replace=False) for _ in range(q_tiles)] for _ in range(heads)]
                     for _ in range(batch)])
    sizes = np.full(kv_tiles, tile)
    sizes[-1] = kv - (kv_tiles - 1) * tile
    if padded:
        sizes = np.minimum(sizes, rng.integers(tile // 2, tile + 1, kv_tiles))
    block_map = np.zeros((batch, heads, q_tiles, kv_tiles), int)
    for b, h, i in np.ndindex(batch, heads, q_tiles):
        block_map[b, h, i, topk[b, h, i]] = 1           # a top-k list is a row of the map
    return topk, block_map, sizes


_VSA = ((300, 300, 64, 2, 2, 1, False), (1000, 1000, 64, 3, 4, 1, True), (1536, 1536, 64, 2, 6, 2, True),
        (777, 900, 16, 2, 8, 1, True))


def _vsa_params(block_map, sizes, s, kv, tile, batch):
    maps = [block_map[b].reshape(block_map.shape[1], -1).tolist() for b in range(batch)]
    return {"seq_len": s, "kv_len": kv, "num_heads": block_map.shape[1], "tile": tile,
            "map": maps[0] if batch == 1 else maps, "sizes": sizes.tolist() if batch == 1 else [sizes.tolist()] * batch}


def _vsa(gym_mask_mod):
    """Bindings of vsa_block_map, with attention-gym's mask_mod from (topk, block_map, tile, sizes or None)."""
    def bindings(rng):
        out = []
        for s, kv, tile, heads, top_k, batch, padded in _VSA:
            topk, block_map, sizes = _vsa_inputs(rng, s, kv, tile, heads, top_k, batch, padded)
            out.append(Binding(_vsa_params(block_map, sizes, s, kv, tile, batch),
                               gym_mask_mod(topk, block_map, tile, sizes if padded else None), batch))
        return out
    return bindings


def _vsa_padding(rng):
    out = []
    for s, kv, tile in ((300, 300, 64), (777, 1000, 64), (1500, 1500, 16)):
        _, _, sizes = _vsa_inputs(rng, 1, kv, tile, 1, 1, 1, True)
        out.append(Binding({"seq_len": s, "kv_len": kv, "tile": tile, "sizes": sizes.tolist()},
                           generate_vsa_padding_mask_mod(sizes, tile)))
    return out


def _doc_prefix_lm(offsets, prefix):
    return generate_doc_mask_mod(generate_prefix_lm_mask(prefix), offsets)


def _doc_window(offsets, window):
    return generate_doc_mask_mod(generate_sliding_window(window), offsets)


CATALOGUE_ENTRIES = [
    Entry("causal_mask", "causal.mask", _causal),
    Entry("generate_sliding_window(window_size)", "sliding_window.mask", _sliding_window),
    Entry("generate_prefix_lm_mask(prefix_length)", "prefix_lm.mask", _prefix_lm),
    Entry("generate_doc_mask_mod(causal_mask, offsets)", "document.mask",
          _documents(lambda offsets: generate_doc_mask_mod(causal_mask, offsets))),
    Entry("generate_doc_mask_mod(noop_mask, offsets)", "bidirectional_document.mask",
          _documents(lambda offsets: generate_doc_mask_mod(noop_mask, offsets))),
    Entry("generate_doc_mask_mod(generate_prefix_lm_mask(prefix), offsets)", "document_mask.mask:document_prefix_lm",
          _documents(_doc_prefix_lm, prefix=lambda rng: rng.integers(0, 40))),
    Entry("generate_doc_mask_mod(generate_sliding_window(window), offsets)",
          "document_mask.mask:document_sliding_window",
          _documents(_doc_window, window=lambda rng: rng.integers(0, 64))),
    Entry("generate_packed_causal_doc_mask_mod(offsets)", "document_mask.mask:packed_causal_document",
          _documents(generate_packed_causal_doc_mask_mod)),
    Entry("generate_packed_causal_doc_mask_mod(offsets)", "document.mask",
          _documents(generate_packed_causal_doc_mask_mod)),
    Entry("batchify_mask_mod(noop_mask, batchify_size)", "batchify.mask:batchify_noop", _batchify(noop_mask)),
    Entry("batchify_mask_mod(causal_mask, batchify_size)", "batchify.mask:batchify_causal", _batchify(causal_mask)),
    Entry("generate_block_diffusion_mask(seq_len, block_size)", "block_diffusion.mask", _block_diffusion),
    Entry("generate_dilated_sliding_window(window_size, dilation)",
          "dilated_sliding_window.mask:dilated_sliding_window", _dilated),
    Entry("generate_vision_cross_attention_mask_mod(intervals, image_token_length)",
          "flamingo.mask:vision_cross_attention", _flamingo),
    Entry("generate_global_sliding_window(window_size, is_global)",
          "global_sliding_window.mask:global_sliding_window", _global_sliding_window),
    Entry("generate_jetspec_tree_causal_mask_mod(prefix_length, ancestor_matrix)", "tree_verify.mask", _jetspec_tree),
    Entry("generate_jetspec_training_mask_mod(prefix_length, block_size)", "jetspec.mask:jetspec_training",
          _jetspec_training),
    Entry("generate_natten(canvas_w, canvas_h, kernel_w, kernel_h)", "natten.mask:natten", _natten),
    Entry("generate_natten(w, w, kernel, kernel), odd kernel", "neighborhood.mask", _neighborhood),
    Entry("generate_tiled_natten(W, H, K_W, K_H, T_W, T_H)", "natten.mask:tiled_natten", _tiled_natten),
    Entry("generate_morton_natten(canvas_w, canvas_h, kernel_w, kernel_h)", "natten.mask:morton_natten",
          _morton_natten),
    Entry("generate_shared_prefix_mask_mod(offsets, prefix_document_id)", "shared_prefix.mask:shared_prefix",
          _shared_prefix),
    Entry("generate_sta_mask_mod_2d(canvas_hw, kernel_hw, tile_hw, text_seq_len)", "sliding_tile.mask", _sta_2d),
    Entry("generate_sta_mask_mod_3d(canvas_twh, kernel_twh, tile_twh, text_seq_len)", "sliding_tile.mask", _sta_3d),
    Entry("generate_spatial_head_mask_mod(...)", "svg.mask:spatial_head", _svg_spatial),
    Entry("generate_temporal_head_mask_mod(...)", "svg.mask:temporal_head", _svg_temporal),
    Entry("generate_vsa_mask_mod(topk_indices, tile_numel, variable_block_sizes)", "vsa.mask:vsa_block_map",
          _vsa(lambda topk, block_map, *rest: generate_vsa_mask_mod(topk, *rest))),
    Entry("generate_vsa_block_map_mask_mod(block_map, tile_numel, variable_block_sizes)", "vsa.mask:vsa_block_map",
          _vsa(lambda topk, block_map, *rest: generate_vsa_block_map_mask_mod(block_map, *rest))),
    Entry("generate_vsa_padding_mask_mod(variable_block_sizes, tile_numel)", "vsa.mask:vsa_padding", _vsa_padding),
]
IDS = [f"{e.function.split('(')[0]}-{e.source.split(':')[-1].removesuffix('.mask')}" for e in CATALOGUE_ENTRIES]


@functools.lru_cache(maxsize=None)
def bound_cases(index: int):
    """(bound mask, Binding) for every binding of catalogue entry ``index`` (drawn from a generator seeded by the
    function's name: the same values on every run)."""
    entry = CATALOGUE_ENTRIES[index]
    mask = entry.load()
    rng = np.random.default_rng(zlib.crc32(entry.function.encode()))
    return mask, [(mask.bind(**b.params), b) for b in entry.bindings(rng)]


@pytest.mark.parametrize("index", range(len(CATALOGUE_ENTRIES)), ids=IDS)
def test_equal_cell_for_cell(index):
    mask, cases = bound_cases(index)
    for bound, binding in cases:
        q = np.arange(bound.seq_len, dtype=np.int64)[:, None]
        k = np.arange(bound.kv_len, dtype=np.int64)[None, :]
        for b in range(binding.batch):
            for h in range(bound.num_heads or 1):
                want = np.broadcast_to(binding.gym(b, h, q, k), (bound.seq_len, bound.kv_len))
                got = bound.dense(b, h)
                bad = np.argwhere(got != want)
                assert not len(bad), (f"{CATALOGUE_ENTRIES[index].function} at {binding.params.get('seq_len')} tokens, "
                                      f"batch element {b}, head {h}: {len(bad)} cells differ, first (q, k) = "
                                      f"{tuple(bad[0])}")


@pytest.mark.parametrize("index", range(len(CATALOGUE_ENTRIES)), ids=IDS)
def test_tiles_exact_or_within_five_percent(index):
    """bench/tile_excess.py's measure: the PARTIAL tiles that are really FULL or EMPTY (for every head at once,
    as the classes are), over every binding at the kernels' tile shapes, at most 5% of the PARTIAL ones; none
    for a mask maskc calls exact, whose tile maps say so."""
    mask, cases = bound_cases(index)
    partial = excess = 0
    for bound, _ in cases:
        for bm, bn in TILES:
            audit = audit_tiles(bound, bm, bn)
            assert audit.unsound == 0
            partial, excess = partial + audit.partial, excess + audit.really_full + audit.really_empty
            if mask.exact:
                assert audit.really_full + audit.really_empty == 0
                assert bound.tile_map(bm, bn).exact or mask.reads_head
    assert excess <= MAX_EXCESS * partial, f"{excess} of {partial} PARTIAL tiles are really FULL or EMPTY"


def test_catalogue_masks_lint_without_errors():
    """Every catalogue file lints clean of errors; the sound-only masks say where and why."""
    sound_only = {"flamingo.mask", "global_sliding_window.mask", "natten.mask", "vsa.mask"}
    for path in sorted(CATALOGUE.glob("*.mask")):
        diagnostics = lint_file(path)
        assert not [d for d in diagnostics if d.severity == "error"], path
        warned = {d for d in diagnostics if d.severity == "warning"}
        assert all("sound but not exact" in d.message for d in warned), (path, warned)
        assert bool(warned) == (path.name in sound_only), path


def test_every_function_of_the_catalogue_has_an_entry():
    """attention-gym's mask_mods at GYM_COMMIT (attn_gym/masks/__init__.py's exports, and the two VSA mask_mods
    its module defines besides): each has an entry above, or is a helper that builds no mask_mod."""
    exported = {"batchify_mask_mod", "generate_block_diffusion_mask", "causal_mask", "generate_dilated_sliding_window",
                "generate_doc_mask_mod", "generate_packed_causal_doc_mask_mod",
                "generate_vision_cross_attention_mask_mod", "generate_global_sliding_window",
                "generate_jetspec_training_mask_mod", "generate_jetspec_tree_causal_mask_mod",
                "generate_morton_natten", "generate_natten", "generate_tiled_natten", "generate_prefix_lm_mask",
                "generate_shared_prefix_mask_mod", "generate_sliding_window", "generate_sta_mask_mod_2d",
                "generate_sta_mask_mod_3d", "generate_spatial_head_mask_mod", "generate_temporal_head_mask_mod",
                "generate_vsa_mask_mod", "generate_vsa_block_map_mask_mod", "generate_vsa_padding_mask_mod"}
    covered = {e.function.split("(")[0] for e in CATALOGUE_ENTRIES}
    assert exported == covered


# ---- score mods -------------------------------------------------------------------------------------------------

def _score_cases():
    rng = np.random.default_rng(19)
    H, S = 8, 300
    rel_bias, head_scale, offset = sandwich_tables(H, S)
    return [
        ("generate_alibi_bias(H)", maskc.load(EXAMPLES / "alibi.mask").bind(
            seq_len=S, num_heads=H, slope=[2 ** (-8 * (h + 1) / H) for h in range(H)]), generate_alibi_bias(H)),
        ("generate_tanh_softcap(30)", maskc.load(EXAMPLES / "softcap.mask").bind(seq_len=S, cap=30.0),
         generate_tanh_softcap(30)),
        ("generate_tanh_softcap(50, approx=True)", maskc.load(EXAMPLES / "softcap.mask").bind(seq_len=S, cap=50.0),
         generate_tanh_softcap(50, approx=True)),
        ("generate_sandwich_bias(H, max_seq_len)", maskc.load(CATALOGUE / "sandwich.mask", "sandwich").bind(
            seq_len=S, num_heads=H, offset=offset, rel_bias=rel_bias.tolist(), head_scale=head_scale.tolist()),
         generate_sandwich_bias(H, S)),
    ], rng


def test_score_mods_match_the_score_reference():
    """maskc's score reference (float64, float parameters as the kernels get them: float32) against
    attention-gym's score_mod on random scaled scores, every head; visibility is the examples' (causal)."""
    cases, rng = _score_cases()
    for what, bound, score_mod in cases:
        S = bound.seq_len
        q, k = np.arange(S)[:, None], np.arange(S)[None, :]
        scores = rng.normal(0.0, 20.0, (S, S))
        for h in range(bound.num_heads or 1):
            got, _ = bound.modified_scores(scores, 0, h)
            np.testing.assert_allclose(got, score_mod(scores, 0, h, q, k), rtol=1e-6, atol=1e-5, err_msg=what)
        np.testing.assert_array_equal(bound.dense(), k <= q)
