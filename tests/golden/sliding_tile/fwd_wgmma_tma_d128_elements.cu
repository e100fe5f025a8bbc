// =====================================================================================================
// maskc: flash-attention forward on Hopper (wgmma + TMA, warp-specialized), specialized to the mask `sliding_tile`
//   mask sliding_tile (sliding_tile.mask:12:6)
//   allow q < video, k < video, t(k) in [t0, t0 + window_t), y(k) in [y0, y0 + window_h), x(k) in [x0, x0 + window_w)
//   allow q < video, k in [video, video + text)
//   allow q >= video, k < video + text
//   const tile_t = 4
//   const tile_h = 4
//   const tile_w = 4
//   const tiles_t = 6
//   const tiles_h = 6
//   const tiles_w = 6
//
// Same contract, descriptor walk and notation as the mma.sync kernel (attention_fwd.cu.j2); what differs:
//   warps        NUM_WARPS consumer warps = two warpgroups of 64 query rows each (wgmma: S = Q K^T from
//                shared memory, O += P V with P from registers), plus a producer warpgroup (the last) of
//                which one lane works. Registers move from producer to consumers (setmaxnreg): 56 / 224.
//   persistent   one CTA per SM; each takes work items (row block, head, batch) from an atomic counter,
//                in sections of heads whose K and V fit in L2, heaviest row block first (see the entry).
//   producer     one warp fetches the items, posts them to the consumers (a mailbox), and walks their kv
//                tiles (the same runs the consumers walk): per tile it waits until the stage's K buffer is
//                free (k_empty) and asks the copy engine for K (k_full, counted in bytes), then likewise for V;
//                K of tile j + 1 goes before V of tile j, the order the consumers need them in. Each item's Q
//                (q_full) once the consumers have let go of the last one (q_empty). No thread copies data.
//   consumers    wait for a stage's K, compute S and release K, mask and softmax, wait for its V,
//                accumulate P V and release V (one arrival per consumer warp). The two warpgroups never wait
//                for each other (with ping-pong they take turns to issue products), so one's softmax
//                overlaps the other's products. O is staged through its own buffer, so the next Q can land
//                during the epilogue.
//   layout       128B-swizzled tiles written by the copy engine (tensor maps with CU_TENSOR_MAP_SWIZZLE_128B,
//                boxes of 64 columns): the layout wgmma reads (wgmma.cu.j2).
// =====================================================================================================

// ---- constants (from the schedule) -----------------------------------------------------------------
constexpr int HEAD_DIM  = 128;
constexpr int BLOCK_M   = 128;
constexpr int BLOCK_N   = 128;
constexpr int NUM_WARPS = 8;          // consumer warps
constexpr int NUM_WGS   = NUM_WARPS / 4;                // consumer warpgroups, 64 query rows each
constexpr int KV_STAGES = 2;
// O is staged through its own buffer (the next item's Q can land during the epilogue) or, where shared
// memory is short (D = 256), through Q's (the next Q then waits for the epilogue).
constexpr bool O_IN_Q_BUFFER = false;
constexpr bool IS_BF16  = true;   // else fp16

constexpr int CONSUMER_THREADS = NUM_WARPS * 32;
constexpr int NUM_THREADS      = 384;      // the launch's block size
static_assert(NUM_THREADS == CONSUMER_THREADS + 128, "the consumers plus a whole producer warpgroup");
// Registers per thread after setmaxnreg (the schedule's choice: the most the consumers can have while ptxas
// spills nothing in the producer).
constexpr int PRODUCER_REGISTERS = 56, CONSUMER_REGISTERS = 224;
constexpr int N_TILES     = BLOCK_N / 8;        // 8-column groups of the S accumulator
constexpr int D_TILES     = HEAD_DIM / 8;       // 8-column groups of the O accumulator
constexpr int CHUNKS      = HEAD_DIM / 8;       // 16-byte chunks per row
constexpr int COL_BLOCKS  = HEAD_DIM / 64;      // 128-byte column blocks (one copy-engine box each)

constexpr int Q_TILE_BYTES  = BLOCK_M * HEAD_DIM * 2;
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
// Layout from a 1024-byte aligned base: [Q][K stages][V stages][O staging unless in Q's][barriers][mailbox]
// [the consumer warps' softmax sinks][interval table, or the warps' root tables]
constexpr int SMEM_K_OFFSET   = Q_TILE_BYTES;
constexpr int SMEM_V_OFFSET   = SMEM_K_OFFSET + KV_STAGES * KV_TILE_BYTES;
constexpr int SMEM_O_OFFSET   = O_IN_Q_BUFFER ? 0 : SMEM_V_OFFSET + KV_STAGES * KV_TILE_BYTES;
constexpr int SMEM_BAR_OFFSET = SMEM_V_OFFSET + KV_STAGES * KV_TILE_BYTES + (O_IN_Q_BUFFER ? 0 : Q_TILE_BYTES);
// q_full, q_empty, k_full[], v_full[], k_empty[], v_empty[]
constexpr int NUM_BARRIERS    = 2 + 4 * KV_STAGES;
constexpr int SMEM_ITEM_OFFSET = SMEM_BAR_OFFSET + 8 * NUM_BARRIERS;   // the work-item mailbox: one int
constexpr int SMEM_SINK_OFFSET = SMEM_ITEM_OFFSET + 8;     // a word per consumer warp: softmax_before_wait
constexpr int SMEM_IV_OFFSET  = SMEM_SINK_OFFSET + 4 * NUM_WARPS;
// Named barriers (0 is __syncthreads; 2 + wg are the ping-pong turns): the mailbox is full / has been read.
constexpr int MAILBOX_FULL = 8, MAILBOX_EMPTY = 9, MAILBOX_THREADS = CONSUMER_THREADS + 32;
constexpr int SMEM_ALIGN      = 1024;           // the swizzle atom; the dynamic base is rounded up to it
constexpr int SMEM_BYTES = SMEM_IV_OFFSET + SMEM_ALIGN;

constexpr int KIND_PARTIAL = 1;
constexpr int KIND_FULL    = 2;
static_assert(KIND_PARTIAL == 1 && KIND_FULL == 2, "tile kinds as in maskc.kernel_ir");

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head dims 64, 128 and 256");
static_assert((NUM_WGS == 2 || NUM_WGS == 3) && NUM_WARPS == 4 * NUM_WGS && BLOCK_M == 64 * NUM_WGS,
              "two or three consumer warpgroups of 64 rows");
static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 64 && BLOCK_N <= 128, "BLOCK_N a multiple of 16 in [64, 128]");
static_assert(KV_STAGES >= 2, "at least double buffering");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA on sm_90");
static_assert(SMEM_BYTES == 197752, "the launch gives what maskc.codegen.plan computed");

// ---- the generated mask predicate (maskc.codegen.predicate), verbatim ---------------------------------
// Every form is computed in maskc_int, 64 bits (bind proves each intermediate fits: maskc.analysis.widths); the
// kernels of bindings proved to fit in 32 bits compute in int instead.
typedef long long maskc_int;
// Key bounds are clamped into [-1, kv_len] before they are narrowed to int.
// Floor division and modulo as in Python (den > 0, checked when the mask was bound), for maskc_int and for
// the 64-bit chunk nests; 32-bit division when both operands fit, as they nearly always do (the test folds
// away for int). Division by a constant power of two is written as a shift or a mask instead.
template <class T>
__device__ __forceinline__ T maskc_floordiv(T num, T den) {
    if (num == (int)num && den == (int)den) {
        const int n = (int)num, d = (int)den, q = n / d;
        return (n % d != 0 && n < 0) ? q - 1 : q;
    }
    const T q = num / den;
    return (num % den != 0 && num < 0) ? q - 1 : q;
}
template <class T>
__device__ __forceinline__ T maskc_ceildiv(T num, T den) {
    return -maskc_floordiv(-num, den);
}
template <class T>
__device__ __forceinline__ T maskc_floormod(T num, T den) {
    return num - den * maskc_floordiv(num, den);
}

// floor(sqrt(n)) (0 for n <= 0): a double-precision root, corrected to the exact integer either way; for a
// 32-bit n (the narrow predicate's, inside every chunk loop: a fp64 square root is a dozen double operations)
// a single-precision root, then one step each way without a branch, in unsigned 32 bits: for every
// 0 < n < 2**31, sqrtf of (float)n (both correctly rounded) truncates to the answer or one off it (checked
// for every such n on the host; tests/test_predicate.py checks those next to a square), and r + 1 <= 46341,
// whose square fits in 32 unsigned bits. No 64-bit compares, no loops whose trip counts split a warp.
__device__ __forceinline__ long long maskc_isqrt(long long n) {
    if (n <= 0) return 0;
    long long r = (long long)sqrt((double)n);
    while (r * r > n) --r;
    while ((r + 1) * (r + 1) <= n) ++r;
    return r;
}
__device__ __forceinline__ int maskc_isqrt(int n) {
    unsigned r = (unsigned)sqrtf((float)max(n, 0));
    r -= r * r > (unsigned)max(n, 0) ? 1u : 0u;
    r += (r + 1u) * (r + 1u) <= (unsigned)max(n, 0) ? 1u : 0u;
    return (int)r;
}

// Bits a..b of a visibility word (clamped to the word); 0 when [a, b] misses it.
template <class Word>
__device__ __forceinline__ Word maskc_span_bits(int a, int b) {
    constexpr int TOP = 8 * (int)sizeof(Word) - 1;
    a = max(a, 0);
    b = min(b, TOP);
    if (a > b) return Word(0);
    return (~Word(0) >> (TOP - b)) & (~Word(0) << a);
}

// Set, or clear, the keys lo..hi in visibility words of keys from k0 (bit j of word w: key k0 + w * bits + j).
template <class Word, int WORDS>
__device__ __forceinline__ void maskc_set_keys(Word (&bits)[WORDS], int k0, int lo, int hi) {
    constexpr int BITS = 8 * (int)sizeof(Word);
    for (int w = 0; w < WORDS; ++w) bits[w] |= maskc_span_bits<Word>(lo - k0 - w * BITS, hi - k0 - w * BITS);
}
template <class Word, int WORDS>
__device__ __forceinline__ void maskc_clear_keys(Word (&bits)[WORDS], int k0, int lo, int hi) {
    constexpr int BITS = 8 * (int)sizeof(Word);
    for (int w = 0; w < WORDS; ++w) bits[w] &= ~maskc_span_bits<Word>(lo - k0 - w * BITS, hi - k0 - w * BITS);
}

// The segment holding position p: table = [n, bound_0 .. bound_n, ...]. Outside the partitioned
// range, p lies in a gap segment of index -1: [0, bound_0) before it, [bound_n, extent) after it.
struct MaskSegment { int index, start, end; };
__device__ __forceinline__ MaskSegment maskc_segment(const int* __restrict__ table, int p, int extent) {
    const int n = table[0];
    const int* bounds = table + 1;
    if (p < bounds[0]) return MaskSegment{-1, 0, bounds[0]};
    if (p >= bounds[n]) return MaskSegment{-1, bounds[n], extent};
    int lo = 0, hi = n;                       // invariant: bounds[lo] <= p < bounds[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (bounds[mid] <= p) lo = mid; else hi = mid;
    }
    return MaskSegment{lo, bounds[lo], bounds[lo + 1]};
}


// What mask_visible needs of one query row, computed once per row and tile.
struct MaskRow {
    int lo0;
    int hi0;
    int lo1;
    int hi1;
    int lo2;
    int hi2;
    maskc_int v0;
    maskc_int v1;
    maskc_int v2;
    maskc_int v3;
    maskc_int v4;
    maskc_int v5;
    maskc_int v6;
    maskc_int v7;
};

__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) {
    MaskRow row;
    const int extent = max(mask[0], mask[1]);
    (void)extent; (void)b; (void)h;
    // allow sliding_tile.mask:27:3: allow q < video, k < video, t(k) in [t0, t0 + window_t), y(k) in [y0, y0 + window_h), x(k) in [x0, x0 + window_w)
    row.lo0 = 0;
    row.hi0 = (int)max((maskc_int)-1, min((maskc_int)mask[1] - 1, (maskc_int)(((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1)));
    if (!(((maskc_int)q - ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) + 1) <= 0)) { row.lo0 = 1; row.hi0 = 0; }   // row guard fails
    // allow sliding_tile.mask:28:3: allow q < video, k in [video, video + text)
    row.lo1 = (int)min((maskc_int)mask[1], max((maskc_int)0, (maskc_int)((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6))))))));
    row.hi1 = (int)max((maskc_int)-1, min((maskc_int)mask[1] - 1, (maskc_int)((maskc_int)mask[11] + ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1)));
    if (!(((maskc_int)q - ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) + 1) <= 0)) { row.lo1 = 1; row.hi1 = 0; }   // row guard fails
    // allow sliding_tile.mask:29:3: allow q >= video, k < video + text
    row.lo2 = 0;
    row.hi2 = (int)max((maskc_int)-1, min((maskc_int)mask[1] - 1, (maskc_int)((maskc_int)mask[11] + ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1)));
    if (!((-(maskc_int)q + ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6))))))) <= 0)) { row.lo2 = 1; row.hi2 = 0; }   // row guard fails
    row.v0 = min(max(maskc_floormod(maskc_floordiv(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)(6)), (maskc_int)((maskc_int)mask[9] >> 1)), (maskc_int)(((maskc_int)mask[9] >> 1) + (maskc_int)(6) - (maskc_int)mask[9]));
    row.v1 = ((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)));
    row.v2 = ((maskc_int)mask[9] >> 1);
    row.v3 = min(max(maskc_floormod(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)((maskc_int)mask[10] >> 1)), (maskc_int)(((maskc_int)mask[10] >> 1) + (maskc_int)(6) - (maskc_int)mask[10]));
    row.v4 = ((maskc_int)mask[10] >> 1);
    row.v5 = min(max(maskc_floordiv(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)((maskc_int)(6) * (maskc_int)(6))), (maskc_int)((maskc_int)mask[8] >> 1)), (maskc_int)(((maskc_int)mask[8] >> 1) + (maskc_int)(6) - (maskc_int)mask[8]));
    row.v6 = ((maskc_int)(6) * (maskc_int)(6));
    row.v7 = ((maskc_int)mask[8] >> 1);
    return row;
}

__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) {
    const bool allowed = (k >= row.lo0 && k <= row.hi0 && (-row.v0 + maskc_floormod(maskc_floordiv(maskc_floordiv((maskc_int)k, (maskc_int)row.v1), (maskc_int)(6)), (maskc_int)(6)) + row.v2 - (maskc_int)mask[9] + 1) <= 0 && (row.v0 - maskc_floormod(maskc_floordiv(maskc_floordiv((maskc_int)k, (maskc_int)row.v1), (maskc_int)(6)), (maskc_int)(6)) - row.v2) <= 0 && (-row.v3 + maskc_floormod(maskc_floordiv((maskc_int)k, (maskc_int)row.v1), (maskc_int)(6)) + row.v4 - (maskc_int)mask[10] + 1) <= 0 && (row.v3 - maskc_floormod(maskc_floordiv((maskc_int)k, (maskc_int)row.v1), (maskc_int)(6)) - row.v4) <= 0 && (-row.v5 + maskc_floordiv(maskc_floordiv((maskc_int)k, (maskc_int)row.v1), (maskc_int)row.v6) + row.v7 - (maskc_int)mask[8] + 1) <= 0 && (row.v5 - maskc_floordiv(maskc_floordiv((maskc_int)k, (maskc_int)row.v1), (maskc_int)row.v6) - row.v7) <= 0) ||
                   (k >= row.lo1 && k <= row.hi1) ||
                   (k >= row.lo2 && k <= row.hi2);
    return allowed;
}

template <class Emit>
__device__ __forceinline__ void mask_chunks0(const int* __restrict__ mask, int b, int h, int q, int k_first, int k_last, const int* __restrict__ roots, Emit emit) {
    (void)b; (void)h; (void)roots;
    if (k_first > k_last) return;
    const maskc_int j1_first = maskc_floordiv((maskc_int)k_first + (maskc_int)0, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4))));
    const maskc_int j1_last = maskc_floordiv((maskc_int)k_last + (maskc_int)0, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4))));
    const maskc_int j2_first = maskc_floordiv(j1_first + (maskc_int)0, (maskc_int)(6));
    const maskc_int j2_last = maskc_floordiv(j1_last + (maskc_int)0, (maskc_int)(6));
    const maskc_int j3_first = maskc_floordiv(j2_first + (maskc_int)0, (maskc_int)(6));
    const maskc_int j3_last = maskc_floordiv(j2_last + (maskc_int)0, (maskc_int)(6));
    for (maskc_int j3 = max(max((maskc_int)j3_first, (maskc_int)0), (maskc_int)(min(max(maskc_floordiv(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)((maskc_int)(6) * (maskc_int)(6))), (maskc_int)((maskc_int)mask[8] >> 1)), (maskc_int)(((maskc_int)mask[8] >> 1) + (maskc_int)(6) - (maskc_int)mask[8])) - ((maskc_int)mask[8] >> 1))), j3_end = min(min(min((maskc_int)j3_last, maskc_floordiv(maskc_floordiv(maskc_floordiv((maskc_int)(((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1), (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)(6))), maskc_floordiv(maskc_floordiv(maskc_floordiv((maskc_int)((maskc_int)mask[1] - 1), (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)(6))), (maskc_int)(min(max(maskc_floordiv(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)((maskc_int)(6) * (maskc_int)(6))), (maskc_int)((maskc_int)mask[8] >> 1)), (maskc_int)(((maskc_int)mask[8] >> 1) + (maskc_int)(6) - (maskc_int)mask[8])) - ((maskc_int)mask[8] >> 1) + (maskc_int)mask[8] - 1)); j3 <= j3_end; ++j3) {
        for (maskc_int j2 = max(max(max((maskc_int)j2_first, (maskc_int)0), (maskc_int)(min(max(maskc_floormod(maskc_floordiv(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)(6)), (maskc_int)((maskc_int)mask[9] >> 1)), (maskc_int)(((maskc_int)mask[9] >> 1) + (maskc_int)(6) - (maskc_int)mask[9])) - ((maskc_int)mask[9] >> 1) + ((maskc_int)j3 * (maskc_int)(6)))), (maskc_int)((maskc_int)j3 * (maskc_int)(6))), j2_end = min(min(min(min((maskc_int)j2_last, maskc_floordiv(maskc_floordiv((maskc_int)(((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1), (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6))), maskc_floordiv(maskc_floordiv((maskc_int)((maskc_int)mask[1] - 1), (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6))), (maskc_int)(min(max(maskc_floormod(maskc_floordiv(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)(6)), (maskc_int)((maskc_int)mask[9] >> 1)), (maskc_int)(((maskc_int)mask[9] >> 1) + (maskc_int)(6) - (maskc_int)mask[9])) - ((maskc_int)mask[9] >> 1) + (maskc_int)mask[9] + ((maskc_int)j3 * (maskc_int)(6)) - 1)), (maskc_int)((maskc_int)(6) + ((maskc_int)j3 * (maskc_int)(6)) - 1)); j2 <= j2_end; ++j2) {
            for (maskc_int j1 = max(max(max((maskc_int)j1_first, (maskc_int)0), (maskc_int)(min(max(maskc_floormod(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)((maskc_int)mask[10] >> 1)), (maskc_int)(((maskc_int)mask[10] >> 1) + (maskc_int)(6) - (maskc_int)mask[10])) - ((maskc_int)mask[10] >> 1) + ((maskc_int)j2 * (maskc_int)(6)))), (maskc_int)((maskc_int)j2 * (maskc_int)(6))), j1_end = min(min(min(min((maskc_int)j1_last, maskc_floordiv((maskc_int)(((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1), (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4))))), maskc_floordiv((maskc_int)((maskc_int)mask[1] - 1), (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4))))), (maskc_int)(min(max(maskc_floormod(maskc_floordiv((maskc_int)q, (maskc_int)((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))), (maskc_int)(6)), (maskc_int)((maskc_int)mask[10] >> 1)), (maskc_int)(((maskc_int)mask[10] >> 1) + (maskc_int)(6) - (maskc_int)mask[10])) - ((maskc_int)mask[10] >> 1) + (maskc_int)mask[10] + ((maskc_int)j2 * (maskc_int)(6)) - 1)), (maskc_int)((maskc_int)(6) + ((maskc_int)j2 * (maskc_int)(6)) - 1)); j1 <= j1_end; ++j1) {
                const maskc_int lo = max((maskc_int)k_first, (maskc_int)((maskc_int)j1 * ((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))));
                const maskc_int hi = min(min((maskc_int)k_last, (maskc_int)(((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * ((maskc_int)(6) * ((maskc_int)(4) * (maskc_int)(6)))))) - 1)), (maskc_int)(((maskc_int)j1 * ((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4)))) + ((maskc_int)(4) * ((maskc_int)(4) * (maskc_int)(4))) - 1));
                if (lo <= hi) emit((int)lo, (int)hi);
            }
        }
    }
}

// The row's visible keys among k0 .. k0 + WORDS * bits - 1 as words (bit j of word w: key k0 + w * bits
// + j): the allow regions' key intervals set, then the deny regions' cleared; keys past kv_len are the
// caller's to hide. Every region is an interval per row or one per chunk (an exact mask), so a tile
// costs a few interval operations per row, never a predicate per key. roots: the root tables, filled
// for this work item (mask_root_entry), or null (the chunk nests compute their roots).
template <class Word, int WORDS>
__device__ __forceinline__ void mask_bits(const MaskRow& row, const int* __restrict__ mask, int b, int h,
                                          int q, int k0, Word (&bits)[WORDS],
                                          const int* __restrict__ roots = nullptr) {
    (void)roots;
    const int k_last = k0 + WORDS * 8 * (int)sizeof(Word) - 1;
    for (int w = 0; w < WORDS; ++w) bits[w] = Word(0);
    mask_chunks0(mask, b, h, q, max(k0, row.lo0), min(k_last, row.hi0), roots,
                 [&](int lo, int hi) { maskc_set_keys(bits, k0, lo, hi); });
    maskc_set_keys(bits, k0, row.lo1, row.hi1);
    maskc_set_keys(bits, k0, row.lo2, row.hi2);
}

// ---- the element path of PARTIAL tiles (maskc.codegen.elements), verbatim -----------------------------
// Places are raster positions (maskc.codegen.elements.raster_functions): the maps are identities.
constexpr bool MASK_RASTER_ORDER = false, MASK_RASTER_TILES = true;
__device__ __forceinline__ int mask_raster(const int* __restrict__ mask, int p) { (void)mask; return p; }
__device__ __forceinline__ int mask_raster_tile(const int* __restrict__ mask, int k0, int n) {
    (void)mask; (void)n;
    return k0;
}
__host__ __device__ constexpr int mask_raster_step(int j8) { return j8; }

// The element path (maskc.codegen.elements): what the test of a pair needs of its query row, computed
// once per row and tile.
struct MaskElementRow {
    int lo0;
    int hi0;
    int lo1;
    int hi1;
    int lo2;
    int hi2;
    maskc_int v0;
    maskc_int v1;
    maskc_int v2;
    maskc_int v3;
    bool g1;
    bool g2;
};

__device__ __forceinline__ MaskElementRow mask_element_row(const int* __restrict__ mask, int b, int h, int q_place) {
    MaskElementRow row;
    const int q = q_place;
    const int extent = max(mask[0], mask[1]);
    (void)extent; (void)b; (void)h;
    // allow sliding_tile.mask:27:3: allow q < video, k < video, t(k) in [t0, t0 + window_t), y(k) in [y0, y0 + window_h), x(k) in [x0, x0 + window_w)
    row.lo0 = (int)min((maskc_int)mask[1], max((maskc_int)0, (maskc_int)(2304 * min(max((maskc_int)((maskc_int)mask[8] >> 1), maskc_floordiv((maskc_int)q, (maskc_int)2304)), (maskc_int)(((maskc_int)mask[8] >> 1) - (maskc_int)mask[8] + 6)) - 2304 * ((maskc_int)mask[8] >> 1))));
    row.hi0 = (int)max((maskc_int)-1, min(min((maskc_int)mask[1] - 1, (maskc_int)(2304 * min(max((maskc_int)((maskc_int)mask[8] >> 1), maskc_floordiv((maskc_int)q, (maskc_int)2304)), (maskc_int)(((maskc_int)mask[8] >> 1) - (maskc_int)mask[8] + 6)) - 2304 * ((maskc_int)mask[8] >> 1) + 2304 * (maskc_int)mask[8] - 1)), (maskc_int)13823));
    if (!(((maskc_int)q - 13823) <= 0)) { row.lo0 = 1; row.hi0 = 0; }   // row guard fails
    // allow sliding_tile.mask:28:3: allow q < video, k in [video, video + text)
    row.lo1 = (int)min((maskc_int)mask[1], max((maskc_int)0, (maskc_int)13824));
    row.hi1 = (int)max((maskc_int)-1, min((maskc_int)mask[1] - 1, (maskc_int)((maskc_int)mask[11] + 13823)));
    if (!(((maskc_int)q - 13823) <= 0)) { row.lo1 = 1; row.hi1 = 0; }   // row guard fails
    // allow sliding_tile.mask:29:3: allow q >= video, k < video + text
    row.lo2 = 0;
    row.hi2 = (int)max((maskc_int)-1, min((maskc_int)mask[1] - 1, (maskc_int)((maskc_int)mask[11] + 13823)));
    if (!((-(maskc_int)q + 13824) <= 0)) { row.lo2 = 1; row.hi2 = 0; }   // row guard fails
    row.v0 = (min(max(maskc_floormod(maskc_floordiv((maskc_int)q, (maskc_int)384), (maskc_int)6), (maskc_int)((maskc_int)mask[9] >> 1)), (maskc_int)(((maskc_int)mask[9] >> 1) - (maskc_int)mask[9] + 6)) - ((maskc_int)mask[9] >> 1) + (maskc_int)mask[9] - 1);
    row.v1 = (-min(max(maskc_floormod(maskc_floordiv((maskc_int)q, (maskc_int)384), (maskc_int)6), (maskc_int)((maskc_int)mask[9] >> 1)), (maskc_int)(((maskc_int)mask[9] >> 1) - (maskc_int)mask[9] + 6)) + ((maskc_int)mask[9] >> 1));
    row.v2 = (min(max(maskc_floormod((maskc_int)((maskc_int)q >> 6), (maskc_int)6), (maskc_int)((maskc_int)mask[10] >> 1)), (maskc_int)(((maskc_int)mask[10] >> 1) - (maskc_int)mask[10] + 6)) - ((maskc_int)mask[10] >> 1) + (maskc_int)mask[10] - 1);
    row.v3 = (-min(max(maskc_floormod((maskc_int)((maskc_int)q >> 6), (maskc_int)6), (maskc_int)((maskc_int)mask[10] >> 1)), (maskc_int)(((maskc_int)mask[10] >> 1) - (maskc_int)mask[10] + 6)) + ((maskc_int)mask[10] >> 1));
    row.g1 = (((maskc_int)q - 13823) <= 0);
    row.g2 = ((-(maskc_int)q + 13824) <= 0);
    return row;
}

// ... and of its key column, computed once per key column and tile (k: the key's raster position;
// mask_element_col_at takes it, mask_element_col the key's place).
struct MaskElementCol {
    int k;
    maskc_int c0;
    maskc_int c1;
    maskc_int c2;
    maskc_int c3;
    bool in1;
    bool in2;
};

__device__ __forceinline__ MaskElementCol mask_element_col_at(const int* __restrict__ mask, int b, int h, int k) {
    MaskElementCol col;
    const int extent = max(mask[0], mask[1]);
    (void)extent; (void)b; (void)h;
    col.k = k;
    col.c0 = maskc_floormod(maskc_floordiv((maskc_int)k, (maskc_int)384), (maskc_int)6);
    col.c1 = -maskc_floormod(maskc_floordiv((maskc_int)k, (maskc_int)384), (maskc_int)6);
    col.c2 = maskc_floormod((maskc_int)((maskc_int)k >> 6), (maskc_int)6);
    col.c3 = -maskc_floormod((maskc_int)((maskc_int)k >> 6), (maskc_int)6);
    col.in1 = (k >= max((maskc_int)0, (maskc_int)13824)) & (k <= min((maskc_int)mask[1] - 1, (maskc_int)((maskc_int)mask[11] + 13823)));
    col.in2 = (k <= min((maskc_int)mask[1] - 1, (maskc_int)((maskc_int)mask[11] + 13823)));
    return col;
}
__device__ __forceinline__ MaskElementCol mask_element_col(const int* __restrict__ mask, int b, int h, int k_place) {
    return mask_element_col_at(mask, b, h, k_place);
}

// Whether the pair (row, col) is visible: the regions' interval tests and atoms, from row and column values.
__device__ __forceinline__ bool mask_element_visible(const MaskElementRow& row, const MaskElementCol& col,
                                                     const int* __restrict__ mask) {
    (void)mask;
    const bool allowed = ((col.k >= row.lo0) & (col.k <= row.hi0) & (col.c0 <= row.v0) & (col.c1 <= row.v1) & (col.c2 <= row.v2) & (col.c3 <= row.v3)) |
                        (row.g1 & col.in1) |
                        (row.g2 & col.in2);
    return allowed;
}

// ---- end of predicate --------------------------------------------------------------------------------

namespace maskc {

typedef unsigned int u32;
typedef unsigned short u16;

constexpr float LN2 = 0.693147180559945309f;

// ---- PTX wrappers --------------------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte global -> shared copy; src_bytes = 0 fills the destination with zeros (rows out of range).
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// Shared memory written by the ordinary (generic) proxy, cp.async included, must be fenced by each writing
// thread before the barrier after which the async proxy (tensor cores, copy engine) touches it (sm_90).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// c += a * b for one 16x8x16 tile: a row-major 16x16 (4 regs), b column-major 16x8 (2 regs), c fp32 16x8.
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (IS_BF16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{ %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two fp32 -> one register of two 16-bit values (lo in the low half), round to nearest.
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (IS_BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else                   asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Round a warp's fp32 product fragments (16 rows x 8 N columns: x[n] = rows g, g+8, columns 8n + 2t, +1) to
// 16 bits as the A fragments of a following product over those columns: for columns 16kk..16kk+15, a[kk] =
// {row g cols 2t.., row g+8 cols 2t.., row g cols 8+2t.., row g+8 cols 8+2t..} (mma's A layout, which is
// also each warp's slice of wgmma's register A). P of the P V product, P^T and dS^T in the backward.
template <int N>
__device__ __forceinline__ void pack_a_fragments(u32 (&a)[N / 2][4], const float (&x)[N][4]) {
    #pragma unroll
    for (int kk = 0; kk < N / 2; ++kk) {
        a[kk][0] = pack2(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = pack2(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = pack2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = pack2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ float exp2_approx(float x) {   // 2^x; 2^-inf = +0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of ROW_CHUNKS chunks per row.
template <int ROW_CHUNKS = CHUNKS>
__device__ __forceinline__ u32 swizzle(int row, int chunk) {
    return (u32)((row * ROW_CHUNKS + (chunk ^ (row & 7))) * 16);
}

// ldmatrix address tables. Every ldmatrix of a tile reads row `R + lane_row` (R a multiple of 8, known at
// compile time) and chunk `2c + x` (x = 0/1 by lane). Since lane_row % 8 is the same for all R, the swizzled
// chunk is 8 * (c / 4) + ((2 * (c % 4) + x) ^ (lane_row % 8)): four per-lane offsets, plus constants that
// fold into the instruction's immediate. (Without this the compiler keeps one address per ldmatrix live.)
template <int ROW_CHUNKS = CHUNKS>
__device__ __forceinline__ void lane_offsets(u32 (&off)[4], int lane_row, int x) {
    #pragma unroll
    for (int c = 0; c < 4; ++c) off[c] = (u32)((lane_row * ROW_CHUNKS + ((2 * c + x) ^ (lane_row & 7))) * 16);
}
// Byte offset of row R (multiple of 8) and chunk pair c from a lane_offsets table.
template <int ROW_CHUNKS = CHUNKS>
__device__ __forceinline__ u32 tile_offset(const u32 (&off)[4], int R, int c) {
    return off[c & 3] + (u32)(R * ROW_CHUNKS * 16 + (c >> 2) * 128);
}

// Copy `ROWS` rows of D elements, starting at global row `row0` (of `rows_valid`: the rest are zero-filled), into
// a tile of shared memory whose 16-byte chunk `chunk` of row `row` lies at byte offset(row, chunk) from dst;
// THREADS threads (tid = 0 .. THREADS-1) share the work, 16 bytes per cp.async.
template <int ROWS, int THREADS, class Offset>
__device__ __forceinline__ void load_rows(u32 dst, const u16* __restrict__ base, long long row_stride,
                                          int row0, int rows_valid, int tid, Offset offset) {
    static_assert((ROWS * CHUNKS) % THREADS == 0, "tile loads split evenly over the threads");
    #pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / THREADS; ++i) {
        const int c = tid + i * THREADS;
        const int row = c / CHUNKS, chunk = c % CHUNKS;
        const bool valid = row0 + row < rows_valid;
        // An out-of-range row reads nothing (src_bytes = 0) from a harmless in-range address.
        const u16* src = base + (valid ? (long long)(row0 + row) * row_stride + chunk * 8 : 0);
        cp_async_16(dst + offset(row, chunk), src, valid ? 16 : 0);
    }
}

// load_rows into a tile in the ldmatrix layout (swizzle).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(u32 dst, const u16* __restrict__ base, long long row_stride,
                                          int row0, int rows_valid, int tid) {
    load_rows<ROWS, THREADS>(dst, base, row_stride, row0, rows_valid, tid,
                             [](int row, int chunk) { return swizzle(row, chunk); });
}

// Set to -inf the scores of one fragment row (half 0: row g, 1: row g + 8) whose key is hidden: past kv_len
// (when BOUNDS) or not `visible(key)`. key0 = the tile's first key + 2t, this thread's first column.
template <bool BOUNDS, int N_TILES, class Visible>
__device__ __forceinline__ void hide_keys(float (&s)[N_TILES][4], int half, int key0, int kv_len, Visible visible) {
    #pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int key = key0 + nt * 8 + e;
            bool shown = true;
            if constexpr (BOUNDS) shown = key < kv_len;
            shown = shown && visible(key);
            if (!shown) s[nt][half * 2 + e] = neg_inf();
        }
    }
}

// Set to -inf the scores of one fragment row whose bit in `bits` (the tile's visibility words, bit j = key
// k0 + j) is clear, or whose key is past kv_len (when BOUNDS and do_bounds).
template <bool BOUNDS, int N_TILES, int WORDS>
__device__ __forceinline__ void hide_unset(float (&s)[N_TILES][4], int half, unsigned long long (&bits)[WORDS], int t,
                                           int k0, int kv_len, bool do_bounds) {
    #pragma unroll
    for (int w = 0; w < WORDS; ++w) {
        if (BOUNDS && do_bounds) bits[w] &= maskc_span_bits<unsigned long long>(-64 * w, kv_len - 1 - k0 - 64 * w);
        bits[w] >>= 2 * t;
    }
    #pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt)
        #pragma unroll
        for (int e = 0; e < 2; ++e)
            if (!((bits[nt / 8] >> ((nt % 8) * 8 + e)) & 1ull)) s[nt][half * 2 + e] = neg_inf();
}

// The element path (maskc.codegen.elements): set to -inf the scores of this thread's two rows (their values in
// rows) whose pair test fails, or whose key is past kv_len (when bounds); each of the 2 * N_TILES key columns'
// values computed once, from its raster position raster_of(nt, e) (column 8 nt + 2t + e; key0 = the tile's
// first key + 2t).
template <int N_TILES, class RasterOf>
__device__ __forceinline__ void hide_pairs(float (&s)[N_TILES][4], const MaskElementRow (&rows)[2],
                                           const int* __restrict__ mask, int mb, int h, int key0, int kv_len,
                                           bool bounds, RasterOf raster_of) {
    #pragma unroll
    for (int nt = 0; nt < N_TILES; ++nt) {
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
            const MaskElementCol col = mask_element_col_at(mask, mb, h, raster_of(nt, e));
            const bool in_range = !bounds || key0 + 8 * nt + e < kv_len;
            #pragma unroll
            for (int half = 0; half < 2; ++half)
                if (!(in_range && mask_element_visible(rows[half], col, mask))) s[nt][half * 2 + e] = neg_inf();
        }
    }
}

// Mask one 16-row score tile in place: -inf where the predicate (PARTIAL tiles) or the kv_len bound (the
// ragged last tile) hides a key. MASKED/BOUNDS say whether the code exists; do_mask/do_bounds whether it runs
// for this tile (one instantiation can serve every tile kind: a uniform branch per tile). row16 is the tile's
// first row within the q_block; rows past seq_len are computed but never stored. iv_smem: the interval table
// (interval path); roots: the warp's root tables for mask_bits, or null (tile path; the element path reads none).
template <bool MASKED, bool BOUNDS, int N_TILES>
__device__ __forceinline__ void mask_scores(float (&s)[N_TILES][4], int g, int t, int row16, int q0, int k0,
                                            int seq_len, int kv_len, const int* __restrict__ mask, int mb, int h,
                                            const int2* iv_smem, const int* roots, bool do_mask, bool do_bounds) {
    (void)roots;
    if (!((MASKED && do_mask) || (BOUNDS && do_bounds))) return;
    if (MASKED && do_mask) {
        // Element path (maskc.codegen.elements): the mask's test per pair, from the values of this thread's two
        // rows (computed once) and of each of its 2 * N_TILES key columns (computed once, for both rows); rows
        // past seq_len are clamped (computed, never stored), keys past kv_len hidden.
        const MaskElementRow rows[2] = {mask_element_row(mask, mb, h, min(q0 + row16 + g, seq_len - 1)),
                                        mask_element_row(mask, mb, h, min(q0 + row16 + g + 8, seq_len - 1))};
        const bool bounds = BOUNDS && do_bounds;
        // In a token order, a key's raster position: from the tile's first key's once per tile where the tile is
        // whole patches of one band (mask_raster_tile; a constant step per column group), else key by key.
        const int base = MASK_RASTER_TILES ? mask_raster_tile(mask, k0, 8 * N_TILES) : -1;
        if (!MASK_RASTER_ORDER || base >= 0)
            hide_pairs(s, rows, mask, mb, h, k0 + 2 * t, kv_len, bounds,
                       [&](int nt, int e) { return base + 2 * t + mask_raster_step(8 * nt) + e; });
        else
            hide_pairs(s, rows, mask, mb, h, k0 + 2 * t, kv_len, bounds,
                       [&](int nt, int e) { return mask_raster(mask, k0 + 8 * nt + 2 * t + e); });
        return;
    }
    #pragma unroll
    for (int half = 0; half < 2; ++half) hide_keys<true>(s, half, k0 + 2 * t, kv_len, [](int) { return true; });
}


// FlashAttention-4's lazy rescale (flash_attn/cute/softmax.py, rescale_threshold; ForwardPlan.lazy_rescale): a row
// keeps its running maximum until a tile raises it by more than RESCALE_THRESHOLD (log2 units), so its P stay below
// 2^RESCALE_THRESHOLD (bf16, fp16 and the fp32 sums hold them) and, while no row of a warp moves, O needs no
// rescaling: the FMULs of rescale_rows leave the path between the wait for P V and the next products. The LSE
// (m * scale_log2 + log2 l) stays exact whichever maximum l was summed against.
constexpr float RESCALE_THRESHOLD = 8.f;

// Online softmax over one 16-row tile, first half: new row maxima (quad shuffle), each row's running maximum m
// moved to it (with the lazy rescale only where it grew by more than RESCALE_THRESHOLD), then
// s <- P = exp2(s * scale_log2 - m * scale_log2), l <- l * alpha + rowsum(P), with the factor
// alpha = exp2((m_old - m_new) * scale_log2) (1 where m stayed) that the output accumulator still has to be
// scaled by. Returns whether it has to be, the same in all the warp's lanes: with the lazy rescale whether a row
// of the warp moved, else always. m is in raw score units; l is this thread's partial row sum (the quad's are
// added at the end).
template <int N_TILES>
__device__ __forceinline__ bool softmax_update(float (&s)[N_TILES][4], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float scale_log2) {
    static_assert(N_TILES % 2 == 0, "the reductions below take column tiles in pairs");
    bool moved = false;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        // Row maximum and sum with four independent chains each (the softmax sits between two products on
        // the critical path: a single chain of N_TILES * 2 dependent instructions would lengthen it).
        float mx[4] = {m[half], s[0][half * 2], s[0][half * 2 + 1], s[1][half * 2]};
        mx[0] = fmaxf(mx[0], s[1][half * 2 + 1]);
        #pragma unroll
        for (int nt = 2; nt < N_TILES; nt += 2) {
            mx[0] = fmaxf(mx[0], s[nt][half * 2]);
            mx[1] = fmaxf(mx[1], s[nt][half * 2 + 1]);
            mx[2] = fmaxf(mx[2], s[nt + 1][half * 2]);
            mx[3] = fmaxf(mx[3], s[nt + 1][half * 2 + 1]);
        }
        float row_max = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
        // the four threads of a quad (t = 0..3) hold the row's columns
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        // The first visible key moves m from -inf (+inf > threshold); a row still without one keeps -inf (NaN).
        const bool moves = (row_max - m[half]) * scale_log2 > RESCALE_THRESHOLD;
        moved |= moves;
        const float m_new = moves ? row_max : m[half];
        // A row that has seen no visible key keeps m = -inf; subtract 0 instead, so exp2(-inf) = 0, not NaN.
        const float m_scaled = m_new == neg_inf() ? 0.f : m_new * scale_log2;
        alpha[half] = moves ? exp2_approx(m[half] * scale_log2 - m_scaled) : 1.f;   // old m = -inf -> 0
        m[half] = m_new;
        float sum[4] = {0.f, 0.f, 0.f, 0.f};
        #pragma unroll
        for (int nt = 0; nt < N_TILES; ++nt) {
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float p = exp2_approx(fmaf(s[nt][half * 2 + e], scale_log2, -m_scaled));
                sum[(nt & 1) * 2 + e] += p;
                s[nt][half * 2 + e] = p;
            }
        }
        l[half] = fmaf(l[half], alpha[half], (sum[0] + sum[1]) + (sum[2] + sum[3]));
    }
    return __any_sync(0xffffffffu, moved);
}

// Second half: scale the output accumulator's rows g (alpha[0]) and g + 8 (alpha[1]).
template <int D_TILES>
__device__ __forceinline__ void rescale_rows(float (&acc)[D_TILES][4], const float (&alpha)[2]) {
    #pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt) {
        acc[dt][0] *= alpha[0];
        acc[dt][1] *= alpha[0];
        acc[dt][2] *= alpha[1];
        acc[dt][3] *= alpha[1];
    }
}

// Both halves at once (when nothing else writes acc in between).
template <int N_TILES, int D_TILES>
__device__ __forceinline__ void online_softmax(float (&s)[N_TILES][4], float (&acc)[D_TILES][4], float (&m)[2],
                                               float (&l)[2], float scale_log2) {
    float alpha[2];
    if (softmax_update(s, m, l, alpha, scale_log2)) rescale_rows(acc, alpha);
}

// The natural-log LSE of a finished row (m raw, l the full row sum); -inf for a row that saw no key.
__device__ __forceinline__ float row_lse(float m, float l, float scale_log2) {
    return l > 0.f ? (m * scale_log2 + __log2f(l)) * LN2 : neg_inf();
}

// ---- 128-byte-swizzled tiles, the layout wgmma reads ---------------------------------------------------
// A tile of ROWS rows x D 16-bit elements is stored as D / 64 column blocks of ROWS x 128 bytes; within a
// block, 16-byte chunk c of row r sits at chunk c ^ (r % 8). With every tile 1024-byte aligned this is the
// hardware's 128B swizzle (address bits 4-6 XOR bits 7-9), so a descriptor can point straight at it.
template <int ROWS>
__device__ __forceinline__ u32 sw128_offset(int row, int chunk) {   // chunk: 16-byte chunk 0 .. D/8 - 1
    return (u32)((chunk >> 3) * ROWS * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// load_rows into a 128B-swizzled tile.
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_sw128(u32 dst, const u16* __restrict__ base, long long row_stride,
                                                int row0, int rows_valid, int tid) {
    load_rows<ROWS, THREADS>(dst, base, row_stride, row0, rows_valid, tid,
                             [](int row, int chunk) { return sw128_offset<ROWS>(row, chunk); });
}

// ---- wgmma --------------------------------------------------------------------------------------------
// Matrix descriptor of a 128B-swizzled operand at shared address `addr` (1024-aligned atoms).
//   K-major (A, or B with trans 0): 8-row groups `stride_bytes` apart (1024); the leading offset is unused.
//   MN-major (B with trans 1): `leading_bytes` between 64-element blocks along N, `stride_bytes` between
//   8-row groups along K.
__device__ __forceinline__ unsigned long long sw128_desc(u32 addr, u32 leading_bytes, u32 stride_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(leading_bytes >> 4) << 16) |
           ((unsigned long long)(stride_bytes >> 4) << 32) | (1ull << 62);
}

// The same operand's descriptor `bytes` further on (a multiple of 16). The start address is the low field
// (address >> 4 in 14 bits) and shared addresses stay below 256 KB, so the sum never carries out of it: one add
// with a constant where the products step through a tile, instead of building each descriptor anew.
__device__ __forceinline__ unsigned long long sw128_desc_plus(unsigned long long desc, u32 bytes) {
    return desc + (bytes >> 4);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory"); }

// Pin accumulator registers at this point of the program: the compiler must not move their reads or writes
// across a wgmma issue or wait (it does not know the asynchronous instructions own them in between).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N][4]) {
    #pragma unroll
    for (int i = 0; i < N; ++i)
        #pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e]) :: "memory");
}

// d[64 x 128] (+)= A[64 x 16] * B[16 x 128], fp32 accumulators (this thread: d[j][*] = rows g, g+8 of its warp's
// 16, columns 8j + 2t, +1). A and B from shared memory (SS) or A from registers (RS, the m16n8k16 A fragment).
// TRANS_B (TRANS_A): B (A) is MN-major in shared memory, i.e. stored as its transpose.
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[16][4], unsigned long long a_desc,
                                             unsigned long long b_desc, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, "
        "%64, %65, p, 1, 1, %68, %67;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(a_desc), "l"(b_desc), "r"((int)accumulate), "n"(TRANS_B), "n"(TRANS_A));
}
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[16][4], const u32 (&a)[4],
                                             unsigned long long b_desc, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, "
        "{ %64, %65, %66, %67 }, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"((int)accumulate), "n"(TRANS_B));
}


// The products of one kv tile for one warpgroup: S = Q K^T (SS) and O += P V (RS). Each builds one descriptor
// per operand and steps through the tile from it (sw128_desc_plus: one add a k-step).
__device__ __forceinline__ void qk_product(float (&s)[N_TILES][4], u32 q_wg_smem, u32 k_smem) {
    const unsigned long long a0 = sw128_desc(q_wg_smem, 16, 1024);
    const unsigned long long b0 = sw128_desc(k_smem, 16, 1024);
    #pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        // k-step kk: column block kk / 4, 32 bytes per step inside it
        const u32 step = (kk & 3) * 32;
        wgmma_ss_n128<0>(s, sw128_desc_plus(a0, (kk >> 2) * BLOCK_M * 128 + step),
                                     sw128_desc_plus(b0, (kk >> 2) * BLOCK_N * 128 + step), kk > 0);
    }
}

__device__ __forceinline__ void pv_product(float (&acc)[D_TILES][4], const u32 (&p)[BLOCK_N / 16][4], u32 v_smem) {
    const unsigned long long b0 = sw128_desc(v_smem, BLOCK_N * 128, 1024);
    #pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        // keys 16kk .. 16kk+15: two 8-row groups of every column block; column blocks BLOCK_N * 128 bytes apart
        wgmma_rs_n128<1>(acc, p[kk], sw128_desc_plus(b0, kk * 16 * 128), true);
    }
}

// ---- the forward's epilogue for one warp (rows warp_row0 .. +15 of a q_block starting at q0) ---------------
// Finish the row sums, normalize, write LSE (when lse != nullptr) and O: the rows go through `staging` (a
// 128B-swizzled BLOCK_M x HEAD_DIM tile of which only this warp's rows are touched) so that each row leaves
// in 16-byte stores. Rows at or past seq_len are not written.
template <int D_TILES>
__device__ __forceinline__ void store_warp_rows(const float (&acc)[D_TILES][4], const float (&m)[2], const float (&l)[2],
                                                u32 staging, int warp_row0, int lane, int q0, int seq_len,
                                                float scale_log2, float* __restrict__ lse_row0,
                                                u16* __restrict__ o_row0, long long o_row_stride) {
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        float row_sum = l[half];
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
        const float inv = row_sum > 0.f ? 1.f / row_sum : 0.f;   // no visible key -> O = 0, LSE = -inf
        const int row = warp_row0 + g + half * 8;
        if (lse_row0 != nullptr && t == 0 && q0 + row < seq_len) lse_row0[row] = row_lse(m[half], row_sum, scale_log2);
        #pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt) {
            const u32 packed = pack2(acc[dt][half * 2] * inv, acc[dt][half * 2 + 1] * inv);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(staging + sw128_offset<BLOCK_M>(row, dt) + 4 * t), "r"(packed));
        }
    }
    __syncwarp();
    #pragma unroll
    for (int i = 0; i < 16 * D_TILES / 32; ++i) {
        const int c = lane + i * 32;
        const int row = warp_row0 + c / D_TILES, chunk = c % D_TILES;
        if (q0 + row < seq_len) {
            u32 x0, x1, x2, x3;
            asm volatile("ld.shared.v4.u32 { %0, %1, %2, %3 }, [%4];\n"
                         : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(staging + sw128_offset<BLOCK_M>(row, chunk)));
            u16* dst = o_row0 + (long long)row * o_row_stride + chunk * 8;
            asm volatile("st.global.v4.u32 [%0], { %1, %2, %3, %4 };\n"
                         :: "l"(dst), "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
        }
    }
    __syncwarp();   // the staging rows may be written again
}

// ---- mbarriers and the bulk tensor copy engine (TMA) ----------------------------------------------------
// A tensor map (CUtensorMap, built on the host by maskc.runtime.tma) passed by value as a __grid_constant__ parameter.
struct alignas(64) TensorMap { unsigned long long opaque[16]; };

// The registers a CTA of `threads` threads holds from launch to exit under __launch_bounds__(threads, 1): ptxas
// gives a kernel that uses setmaxnreg the most per thread that fit, in whole units of 8 (168 at 384 threads, 128
// at 512). setmaxnreg only moves registers between the CTA's warpgroups: an increase that the others' decreases
// do not cover waits for ever (a hang, not an error), so every split is checked against this pool.
__host__ __device__ constexpr int launch_register_pool(int threads) {
    return threads * (65536 / threads / 8 * 8 < 256 ? 65536 / threads / 8 * 8 : 256);
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}
// Make the initialized barriers visible to the copy engine (async proxy) before any copy names them.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Arrive and announce `bytes` more bytes of copy-engine traffic the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// Spin until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred done;\nwait_again:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_again;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}

// Named barriers between warps (ids 1..15): sync waits until `threads` threads have arrived or synced,
// arrive does not wait. Both order this thread's earlier memory accesses before the barrier completes.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// One box of a 4-D tensor map (coordinates innermost first: column, row, head, batch) into shared memory;
// completion is counted in bytes on `bar`. Rows past the tensor's end arrive as zeros.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap& map, int col, int row, int head, int batch, u32 bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, { %2, %3, %4, %5 }], [%6];\n"
                 :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(col), "r"(row), "r"(head),
                    "r"(batch), "r"(bar) : "memory");
}

// A contiguous piece of global memory into shared memory (both 16-byte aligned, `bytes` a multiple of 16);
// completion is counted in bytes on `bar`.
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Add `bytes` of fp32 in shared memory to global memory through the copy engine (both 16-byte aligned),
// as one bulk group: cp.async.bulk.wait_group.read tells when the source may be overwritten.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Additions in turn (a deterministic sum over CTAs): wait until `turn` counts `mine` additions done (acquire:
// they are then visible), and after one's own, count it (release). As FA3/FA4 order their deterministic dQ.
__device__ __forceinline__ void wait_turn(const int* turn, int mine) {
    int done;
    while (true) {
        asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(done) : "l"(turn) : "memory");
        if (done == mine) return;
        __nanosleep(32);
    }
}

__device__ __forceinline__ void pass_turn(int* turn) {
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" :: "l"(turn) : "memory");
}

static_assert(128 * PRODUCER_REGISTERS + CONSUMER_THREADS * CONSUMER_REGISTERS <= launch_register_pool(NUM_THREADS),
              "setmaxnreg's split within the registers the CTA holds from launch");

// Ping-pong: warpgroup wg issues its products only between taking its turn (named barrier 2 + wg, which
// the previous warpgroup's 128 threads arrive at) and passing it on to the next (round robin); so one
// warpgroup's softmax runs while another's products occupy the tensor cores, instead of all contending.
__device__ __forceinline__ void take_turn(int wg) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(2 + wg), "n"(256) : "memory");
}
__device__ __forceinline__ void pass_turn(int wg) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(2 + (wg + 1) % NUM_WGS), "n"(256) : "memory");
}

// The softmax of tile j + 1 runs while the tensor cores finish P V of tile j; but a wgmma wait has no operands,
// and ptxas schedules it as early as the last memory operation before it allows, with the softmax (registers alone)
// after it: the overlap lost (run 79's SASS: the wait for P V came before the first FMNMX; FA4's before the first
// exponential). A store of the row sums, which need every exponential, to the warp's word at `sink` keeps the
// softmax ahead of the wait: one 4-byte store per warp and tile (runs 82-83, causal 32K: 3.5-3.7% fewer cycles).
__device__ __forceinline__ void softmax_before_wait(u32 sink, const float (&l)[2], int lane) {
    if (lane == 0) asm volatile("st.shared.f32 [%0], %1;\n" :: "r"(sink), "f"(l[0] + l[1]) : "memory");
}

// Issue products (wgmma) within one turn of the ping-pong, when it is on.
template <class Issue>
__device__ __forceinline__ void in_turn(int wg, Issue&& issue) {
    take_turn(wg);
    issue();
    pass_turn(wg);
}

// The row block's kv tiles in order: the runs' blocks, one after the other. slots: the number of each run's
// first PARTIAL tile (the stored path's run_slots), read by slot() alone.
struct TileWalk {
    const int* runs;
    const int* slots;
    int run, run_end, kv_block, kv_first, kv_end, kind;

    __device__ __forceinline__ TileWalk(const int* runs_, int run_, int run_end_, const int* slots_ = nullptr)
        : runs(runs_), slots(slots_), run(run_), run_end(run_end_) {
        if (run < run_end) load_run();
    }
    __device__ __forceinline__ void load_run() {
        kv_block = kv_first = runs[3 * run]; kv_end = runs[3 * run + 1]; kind = runs[3 * run + 2];
    }
    __device__ __forceinline__ bool valid() const { return run < run_end; }
    __device__ __forceinline__ void next() {
        if (++kv_block == kv_end && ++run < run_end) load_run();
    }
    // the number of the PARTIAL tile the walk is at, among the view's (maskc.runs.partial_slots)
    __device__ __forceinline__ int slot() const { return slots[run] + kv_block - kv_first; }
};

}  // namespace maskc

// ---- entry -------------------------------------------------------------------------------------------
// Work items. The (batch, head) pairs hb = by * Hq + h (by < batch_grid: the data's batch elements when the
// mask is broadcast over the batch, else 1) are cut into sections of l2_heads pairs, chosen on the host so
// that one section's K and V fit in L2; items go section by section, and within a section row block by row
// block in the descriptor's heaviest-first order (work_order[w]), the section's pairs next to each other:
// the CTAs running at one time read the K and V of a few heads, which stay in L2 (the scheduler of FA4's
// Hopper kernel does the same). Before the sections, the first front_rows row blocks of that order go for
// every pair: rows so long that, started in the last section, they would end well after the rest
// (maskc.runs.front_rows: CLEAR's text rows, which see every key). CTAs take items dynamically: the producer
// warp of each CTA fetches the next index from schedule[0] (an atomic counter) ahead of time and hands it to
// the consumers through a one-int mailbox in shared memory, guarded by two named barriers (full, read); the
// last CTA to run out resets schedule[0..1] to 0 for the next launch on the stream (the runtime keeps one
// schedule buffer per stream). With one CTA per SM this is a longest-processing-time-first schedule within
// each section.
// Block: NUM_THREADS. Dynamic smem: SMEM_BYTES. Parameters (maskc.codegen.plan): q, k, v, o (B, H, S, D) 16-bit and lse
// [B, Hq, S] float32 or null, element strides (batch, head, row) with the last dim contiguous, the
// descriptor's arrays; q_map, k_map, v_map: 4-D tensor maps over (D, rows, heads, batch) of q, k, v, boxes of
// 64 x BLOCK_M (q) or 64 x BLOCK_N (k, v) elements, 128B swizzle (maskc.runtime.tma).
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1) maskc_fwd_sliding_tile(
    const unsigned short* __restrict__ q,
    const unsigned short* __restrict__ k,
    const unsigned short* __restrict__ v,
    unsigned short* __restrict__ o,
    float* __restrict__ lse,
    long long q_sb,
    long long q_sh,
    long long q_ss,
    long long k_sb,
    long long k_sh,
    long long k_ss,
    long long v_sb,
    long long v_sh,
    long long v_ss,
    long long o_sb,
    long long o_sh,
    long long o_ss,
    int num_heads,
    int num_kv_heads,
    int seq_len,
    int kv_len,
    int mask_batch,
    const int* __restrict__ run_offsets,
    const int* __restrict__ runs,
    const int* __restrict__ work_order,
    const int* __restrict__ mask_data,
    const int* __restrict__ mask_offsets,
    float scale_log2,
    const __grid_constant__ maskc::TensorMap q_map,
    const __grid_constant__ maskc::TensorMap k_map,
    const __grid_constant__ maskc::TensorMap v_map,
    int batch_grid,
    int n_work,
    int l2_heads,
    int front_rows,
    int* __restrict__ schedule) {
    using namespace maskc;
    extern __shared__ __align__(1024) unsigned char smem_raw[];

    // the warp index through a shuffle: the compiler then knows it warp-uniform, and keeps the descriptors
    // derived from it (Q's) in uniform registers (no conversion before each wgmma)
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const int q_blocks = (seq_len + BLOCK_M - 1) / BLOCK_M;
    const int pairs = batch_grid * num_heads;                 // (batch, head) pairs
    const int num_items = n_work * pairs;

    const u32 smem0 = (smem_address(smem_raw) + SMEM_ALIGN - 1) & ~(u32)(SMEM_ALIGN - 1);
    unsigned char* smem = smem_raw + (smem0 - smem_address(smem_raw));
    const u32 q_smem = smem0;
    const u32 q_full  = smem0 + SMEM_BAR_OFFSET;                 // Q has landed
    const u32 q_empty = q_full + 8;                              // every consumer warp is done with Q
    auto k_full   = [&](int stage) { return q_full + 8 * (2 + stage); };
    auto v_full   = [&](int stage) { return q_full + 8 * (2 + KV_STAGES + stage); };
    auto k_empty  = [&](int stage) { return q_full + 8 * (2 + 2 * KV_STAGES + stage); };
    auto v_empty  = [&](int stage) { return q_full + 8 * (2 + 3 * KV_STAGES + stage); };
    volatile int* mailbox = reinterpret_cast<int*>(smem + SMEM_ITEM_OFFSET);   // the next work item

    // What one work item is about (both roles decode it the same way).
    struct Item { int h, b, mb, q0, hk, r; };
    auto decode = [&](int item) {
        int w, hb;
        if (item < front_rows * pairs) {                          // the long rows, for every pair
            w = item / pairs;
            hb = item - w * pairs;
        } else {
            const int rest = item - front_rows * pairs;
            const int per_section = l2_heads * (n_work - front_rows);
            const int section = rest / per_section, within = rest - section * per_section;
            const int full_sections = pairs / l2_heads;
            const int width = section < full_sections ? l2_heads : pairs - full_sections * l2_heads;
            w = front_rows + within / width;
            hb = section * l2_heads + (within - (w - front_rows) * width);
        }
        Item it;
        it.h = hb % num_heads;
        it.r = work_order[w];                                     // row block
        it.mb = it.r / q_blocks;                                  // the mask's batch element
        it.b = mask_batch == 1 ? hb / num_heads : it.mb;          // the data's batch element
        it.q0 = (it.r % q_blocks) * BLOCK_M;
        it.hk = it.h / (num_heads / num_kv_heads);
        return it;
    };

    if (tid == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, NUM_WARPS);               // one arrival per consumer warp
        for (int s = 0; s < KV_STAGES; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(k_empty(s), NUM_WARPS);
            mbar_init(v_empty(s), NUM_WARPS);
        }
        mbar_init_fence();
    }
    __syncthreads();   // barriers initialized

    if (warp >= NUM_WARPS) {
        // ================= producer warpgroup: one warp fetches work and drives the copy engine =================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(PRODUCER_REGISTERS));
        if (warp == NUM_WARPS) {
            // The whole warp walks the work in step (the mailbox's named barriers count whole warps); lane 0
            // alone fetches items and issues the copies.
            const bool leader = lane == 0;
            // Tile j (counted over all items) uses stage j % KV_STAGES; its use u = j / KV_STAGES waits for the
            // consumers' release of use u - 1 (parity (u & 1) ^ 1). K and V have their own releases: K(j) is
            // free once S(j) is computed, V(j) once P V(j) is; so K of the next tile can load while P V of
            // this one still reads V.
            auto load_k = [&](const Item& it, int kv_block, int j) {
                const int stage = j % KV_STAGES;
                if (j >= KV_STAGES) mbar_wait(k_empty(stage), ((j / KV_STAGES) & 1) ^ 1);
                if (!leader) return;
                const u32 dst = smem0 + SMEM_K_OFFSET + stage * KV_TILE_BYTES;
                mbar_arrive_expect_bytes(k_full(stage), KV_TILE_BYTES);
                #pragma unroll
                for (int cb = 0; cb < COL_BLOCKS; ++cb)
                    tma_load_4d(dst + cb * BLOCK_N * 128, k_map, cb * 64, kv_block * BLOCK_N, it.hk, it.b, k_full(stage));
            };
            auto load_v = [&](const Item& it, int kv_block, int j) {
                const int stage = j % KV_STAGES;
                if (j >= KV_STAGES) mbar_wait(v_empty(stage), ((j / KV_STAGES) & 1) ^ 1);
                if (!leader) return;
                const u32 dst = smem0 + SMEM_V_OFFSET + stage * KV_TILE_BYTES;
                mbar_arrive_expect_bytes(v_full(stage), KV_TILE_BYTES);
                #pragma unroll
                for (int cb = 0; cb < COL_BLOCKS; ++cb)
                    tma_load_4d(dst + cb * BLOCK_N * 128, v_map, cb * 64, kv_block * BLOCK_N, it.hk, it.b, v_full(stage));
            };
            auto fetch = [&] { return __shfl_sync(0xffffffffu, leader ? atomicAdd(schedule, 1) : 0, 0); };
            int j = 0;                                    // kv tiles issued, over all items
            int item = fetch();
            for (int n = 0;; ++n) {
                // Post the item (or the end: -1) once the consumers have read the last one.
                const bool done = item >= num_items;
                if (n > 0) named_barrier_sync(MAILBOX_EMPTY, MAILBOX_THREADS);
                if (leader) *mailbox = done ? -1 : item;
                named_barrier_arrive(MAILBOX_FULL, MAILBOX_THREADS);
                if (done) break;
                const int next = fetch();                 // fetched now, used next round: its latency hides
                const Item it = decode(item);
                TileWalk walk(runs, run_offsets[it.r], run_offsets[it.r + 1]);
                // K of the first tile before Q: the last item's epilogue may still hold Q's buffer.
                int prev_block = -1;
                if (walk.valid()) { load_k(it, walk.kv_block, j); prev_block = walk.kv_block; walk.next(); }
                if (n > 0) mbar_wait(q_empty, (n - 1) & 1);   // the consumers are done with the last Q
                if (leader) {
                    mbar_arrive_expect_bytes(q_full, Q_TILE_BYTES);
                    #pragma unroll
                    for (int cb = 0; cb < COL_BLOCKS; ++cb)
                        tma_load_4d(q_smem + cb * BLOCK_M * 128, q_map, cb * 64, it.q0, it.h, it.b, q_full);
                }
                // Then in the order the consumers use them: K of tile j + 1 before V of tile j.
                for (; walk.valid(); walk.next(), ++j) {
                    load_k(it, walk.kv_block, j + 1);
                    load_v(it, prev_block, j);
                    prev_block = walk.kv_block;
                }
                if (prev_block >= 0) { load_v(it, prev_block, j); ++j; }
                item = next;
            }
            // Out of work. The last CTA to get here resets the counters for the next launch on this stream
            // (every CTA's last fetch happened before its arrival here).
            if (leader) {
                __threadfence();
                if (atomicAdd(schedule + 1, 1) == (int)gridDim.x - 1) {
                    __threadfence();
                    atomicExch(schedule, 0);
                    atomicExch(schedule + 1, 0);
                }
            }
        }
    } else {
        // ================= consumer warpgroups =================
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(CONSUMER_REGISTERS));
        const int g = lane >> 2, t = lane & 3;
        const int wg = warp >> 2;
        const int warp_row0 = warp * 16;                         // this warp's 16 rows of the q_block
        const u32 q_wg_smem = q_smem + wg * 64 * 128;            // this warpgroup's 64 rows, column block 0
        const u32 o_smem = smem0 + SMEM_O_OFFSET;                // O staging, same layout as Q
        int tiles_done = 0;                                      // kv tiles consumed, over all items
        if (wg == NUM_WGS - 1) pass_turn(wg);                    // warpgroup 0 issues first

        for (int n = 0;; ++n) {
            named_barrier_sync(MAILBOX_FULL, MAILBOX_THREADS);
            const int item = *mailbox;
            named_barrier_arrive(MAILBOX_EMPTY, MAILBOX_THREADS);
            if (item < 0) break;
            const Item it = decode(item);
            const int* mask = mask_data + mask_offsets[it.mb];
            const int2* iv_smem = nullptr;
            (void)iv_smem;
            const int* roots = nullptr;

            float acc[D_TILES][4];
            float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
            #pragma unroll
            for (int dt = 0; dt < D_TILES; ++dt)
                #pragma unroll
                for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;

            TileWalk walk(runs, run_offsets[it.r], run_offsets[it.r + 1]);
            // Stage j of the ring and the parity of its use: use u = j / KV_STAGES completes phase u.
            auto k_tile = [&](int j) { return smem0 + SMEM_K_OFFSET + (j % KV_STAGES) * KV_TILE_BYTES; };
            auto v_tile = [&](int j) { return smem0 + SMEM_V_OFFSET + (j % KV_STAGES) * KV_TILE_BYTES; };
            auto parity = [](int j) { return (u32)((j / KV_STAGES) & 1); };
            // S = Q K^T of tile j, issued (not waited for); its K must have landed
            auto issue_qk = [&](float (&s)[N_TILES][4], int j) {
                wgmma_fence();
                qk_product(s, q_wg_smem, k_tile(j));
                wgmma_commit();
            };
            // O += P V of tile j, issued once its V has landed
            auto issue_pv = [&](const u32 (&p)[BLOCK_N / 16][4], int j) {
                mbar_wait(v_full(j % KV_STAGES), parity(j));
                fence_accumulators(acc);
                wgmma_fence();
                pv_product(acc, p, v_tile(j));
                wgmma_commit();
            };
            // hand a stage's K (after S of its tile has completed) or V (after P V) back to the producer
            auto release = [&](u32 bar) {
                __syncwarp();
                if (lane == 0) mbar_arrive(bar);
            };
            // mask (PARTIAL tiles and the ragged last tile only) the tile `walk` is at
            auto mask_tile = [&](float (&s)[N_TILES][4]) {
                const int k0 = walk.kv_block * BLOCK_N;
                mask_scores<true, true>(s, g, t, warp_row0, it.q0, k0, seq_len, kv_len, mask, it.mb, it.h, iv_smem, roots,
                                        walk.kind != KIND_FULL, k0 + BLOCK_N > kv_len);
            };

            mbar_wait(q_full, n & 1);
            for (; walk.valid(); ++tiles_done, walk.next()) {
                const int j = tiles_done;
                float s[N_TILES][4];
                mbar_wait(k_full(j % KV_STAGES), parity(j));
                in_turn(wg, [&] { issue_qk(s, j); });
                wgmma_wait<0>();
                fence_accumulators(s);
                release(k_empty(j % KV_STAGES));
                mask_tile(s);
                online_softmax(s, acc, m, l, scale_log2);
                u32 p[BLOCK_N / 16][4];
                pack_a_fragments(p, s);
                in_turn(wg, [&] { issue_pv(p, j); });
                wgmma_wait<0>();
                fence_accumulators(acc);
                release(v_empty(j % KV_STAGES));
            }

            // Q is no longer read: the producer may bring the next item's (after the epilogue when O is staged
            // in Q's buffer: then the copy engine's write must also wait for the staging reads)
            if (!O_IN_Q_BUFFER) {
                __syncwarp();
                if (lane == 0) mbar_arrive(q_empty);
            }

            // ---- epilogue: finish the row sums, normalize, write LSE and O (staged through shared memory) ----
            float* lse_row0 = lse != nullptr ? lse + ((long long)it.b * num_heads + it.h) * seq_len + it.q0 : nullptr;
            store_warp_rows(acc, m, l, o_smem, warp_row0, lane, it.q0, seq_len, scale_log2, lse_row0,
                            o + it.b * o_sb + it.h * o_sh + (long long)it.q0 * o_ss, o_ss);
            if (O_IN_Q_BUFFER) {
                fence_proxy_async();
                __syncwarp();
                if (lane == 0) mbar_arrive(q_empty);
            }
        }
    }   // consumers
}
