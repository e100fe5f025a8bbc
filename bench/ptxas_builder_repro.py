"""The ptxas miscompile behind session 19's video failure, kept runnable: the stored path's old builder body (four
32-bit ``mask_bits`` calls per row) and the one that replaced it (one call into 64-bit words), each built standalone
from the generated predicate of one binding (video, width 1: every key its own chunk) under ptxas options, and their
words compared with the words the dense mask implies; beside them the backward's form (tile_visibility: a loop of
one 32-bit call per (row, word) item). On CUDA 13.0 (run 98, H100) the old body was wrong at ptxas -O1
and up and right at -O0; the new one right. Run it on a new toolkit to see whether the old pattern is still unsafe.

    python bench/ptxas_builder_repro.py        # needs a GPU with CuPy
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc.codegen.predicate import emit_predicate, pack_mask_data  # noqa: E402

BLOCK_M, BLOCK_N, WORDS = 192, 128, 4       # the forward's tiles at D = 64; STORED_WORDS

BODY = r'''
typedef unsigned u32;
extern "C" __global__ void __launch_bounds__(TILE_ROWS) builder(const int* tiles, int n_tiles, const int* mask_data,
                                                             const int* mask_offsets, int seq_len, u32* tile_words) {
    const int q_blocks = (seq_len + TILE_ROWS - 1) / TILE_ROWS;
    for (int n = blockIdx.x; n < n_tiles; n += gridDim.x) {
        const int r = tiles[2 * n], k0 = tiles[2 * n + 1] * TILE_KEYS;
        const int mb = r / q_blocks;
        const int* mask = mask_data + mask_offsets[mb];
        const int q = min((r % q_blocks) * TILE_ROWS + (int)threadIdx.x, seq_len - 1);
        const MaskRow row = mask_row(mask, mb, 0, q);
        u32 out[OUT_WORDS] = {};
#if ONE_WALK          // today's builder (templates/tile_words.cu.j2)
        unsigned long long natural[(TILE_KEYS + 63) / 64];
        mask_bits(row, mask, mb, 0, q, k0, natural);
        #pragma unroll
        for (int c = 0; c < TILE_KEYS; ++c)
            out[(c % 8) / 2] |= (u32)((natural[c / 64] >> (c % 64)) & 1ull) << (2 * (c / 8) + c % 2);
#else                 // the builder before session 19
        u32 natural[TILE_KEYS / 32];
        #pragma unroll
        for (int w = 0; w < TILE_KEYS / 32; ++w) {
            u32 word[1];
            mask_bits(row, mask, mb, 0, q, k0 + 32 * w, word);
            natural[w] = word[0];
        }
        #pragma unroll
        for (int c = 0; c < TILE_KEYS; ++c)
            out[(c % 8) / 2] |= ((natural[c / 32] >> (c % 32)) & 1u) << (2 * (c / 8) + c % 2);
#endif
        u32* dst = tile_words + ((long long)n * TILE_ROWS + threadIdx.x) * OUT_WORDS;
        #pragma unroll
        for (int t = 0; t < OUT_WORDS; ++t) dst[t] = out[t];
    }
}

// The backward's shape (templates/attention_bwd.cu.j2, tile_visibility on the tile path): THREADS threads stride
// over (row, 32-bit word) items, one mask_bits call of one word each, in a loop ptxas does not unroll. Natural
// layout: bit j of word w is key k0 + 32 w + j.
extern "C" __global__ void __launch_bounds__(256) visibility(const int* tiles, int n_tiles, const int* mask_data,
                                                            const int* mask_offsets, int seq_len, u32* words) {
    constexpr int WORDS32 = TILE_KEYS / 32;
    const int q_blocks = (seq_len + TILE_ROWS - 1) / TILE_ROWS;
    for (int n = blockIdx.x; n < n_tiles; n += gridDim.x) {
        const int r = tiles[2 * n], k0 = tiles[2 * n + 1] * TILE_KEYS;
        const int mb = r / q_blocks;
        const int* mask = mask_data + mask_offsets[mb];
        for (int i = threadIdx.x; i < TILE_ROWS * WORDS32; i += blockDim.x) {
            const int row = i / WORDS32, key0 = k0 + (i % WORDS32) * 32;
            const int q = min((r % q_blocks) * TILE_ROWS + row, seq_len - 1);
            const MaskRow mr = mask_row(mask, mb, 0, q);
            u32 word[1];
            mask_bits(mr, mask, mb, 0, q, key0, word);
            words[(long long)n * TILE_ROWS * WORDS32 + i] = word[0];
        }
    }
}
'''


def expected(bound, tiles) -> np.ndarray:
    """uint32[n, BLOCK_M, WORDS]: bit 2 nt + e of word t = column 8 nt + 2 t + e, from dense() (rows clamped)."""
    out = np.zeros((len(tiles), BLOCK_M, WORDS), np.uint32)
    for n, (r, kt) in enumerate(tiles.tolist()):
        dense = bound.dense(r)                  # this binding: one q_block per element, so row r is element r
        for row in range(BLOCK_M):
            q = min(row, bound.seq_len - 1)
            for c in range(BLOCK_N):
                k = kt * BLOCK_N + c
                if k < bound.kv_len and dense[q, k]:
                    out[n, row, (c % 8) // 2] |= np.uint32(1 << (2 * (c // 8) + c % 2))
    return out


def expected_natural(bound, tiles) -> np.ndarray:
    """uint32[n, BLOCK_M, BLOCK_N / 32]: bit j of word w = key k0 + 32 w + j, from dense() (rows clamped; the
    caller hides keys past kv_len, as tile_visibility's mask with kv_len does)."""
    out = np.zeros((len(tiles), BLOCK_M, BLOCK_N // 32), np.uint32)
    for n, (r, kt) in enumerate(tiles.tolist()):
        dense = bound.dense(r)
        for row in range(BLOCK_M):
            q = min(row, bound.seq_len - 1)
            for c in range(BLOCK_N):
                k = kt * BLOCK_N + c
                if k < bound.kv_len and dense[q, k]:
                    out[n, row, c // 32] |= np.uint32(1 << (c % 32))
    return out


def main() -> None:
    import cupy

    mask = maskc.load(ROOT / "examples" / "video.mask")
    bound = mask.bind(seq_len=127, width=1, height=6, radius=[0, 1], past=[2, 1])
    _, tiles = bound.descriptor(BLOCK_M, BLOCK_N).partial_slots
    want = expected(bound, tiles)
    want_natural = expected_natural(bound, tiles)
    # keys past kv_len: mask_bits may set them, the backward's caller hides them
    keys = tiles[:, 1, None, None, None] * BLOCK_N + 32 * np.arange(BLOCK_N // 32)[None, None, :, None] + np.arange(32)
    in_range = ((keys < bound.kv_len).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)
    data, offsets = pack_mask_data(mask.ranges, bound.params)
    source = emit_predicate(mask.ranges, bound.constants, narrow=bound.narrow) + BODY
    args = (cupy.asarray(np.ascontiguousarray(tiles, np.int32)), np.int32(len(tiles)),
            cupy.asarray(data.astype(np.int32)), cupy.asarray(offsets.astype(np.int32)), np.int32(bound.seq_len))
    for one_walk in (0, 1):
        for ptxas in ("-O0", "-O1", "-O3"):
            defines = (f"#define ONE_WALK {one_walk}\n#define TILE_ROWS {BLOCK_M}\n#define TILE_KEYS {BLOCK_N}\n"
                       f"#define OUT_WORDS {WORDS}\n")
            module = cupy.RawModule(code=defines + source, options=("-std=c++17", "--gpu-architecture=sm_90a",
                                                                    f"--ptxas-options={ptxas}"))
            words = cupy.zeros(len(tiles) * BLOCK_M * WORDS, cupy.uint32)
            module.get_function("builder")((len(tiles),), (BLOCK_M,), (*args, words))
            got = cupy.asnumpy(words).reshape(want.shape)
            wrong = int((got[:, :bound.seq_len] != want[:, :bound.seq_len]).sum())
            print(f"{'one walk (today)' if one_walk else 'four 32-bit calls (old)':24} ptxas {ptxas}: {wrong} wrong words")
            if one_walk:
                continue
            # the backward's loop (the same module: ONE_WALK does not touch it)
            natural = cupy.zeros(len(tiles) * BLOCK_M * (BLOCK_N // 32), cupy.uint32)
            module.get_function("visibility")((len(tiles),), (256,), (*args, natural))
            got = cupy.asnumpy(natural).reshape(want_natural.shape)
            wrong = int(((got & in_range)[:, :bound.seq_len] != want_natural[:, :bound.seq_len]).sum())
            print(f"{'backward per-word loop':24} ptxas {ptxas}: {wrong} wrong words")


if __name__ == "__main__":
    main()
