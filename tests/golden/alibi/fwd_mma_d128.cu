// =====================================================================================================
// maskc: flash-attention forward, specialized to the mask `alibi`
//   mask alibi (alibi.mask:6:6)
//   allow k <= q
//   score = score - (slope[h] * (-k + q))   (the scaled score of a visible pair, before the softmax)
//
// Notation
//   B, Hq, Hkv   batch size, query heads, key/value heads (GQA/MQA: query head h reads kv head h / (Hq/Hkv))
//   S, Skv       seq_len (queries) and kv_len (keys); neither needs to be a multiple of a tile
//   D            HEAD_DIM, the head dimension
//   BLOCK_M      query rows per CTA (one q_block);  BLOCK_N  keys per kv_block
//   QT, KT       ceil(S / BLOCK_M) q_blocks, ceil(Skv / BLOCK_N) kv_blocks
//   row block    r = mb * QT + qb: one (mask batch element mb, q_block qb); the descriptor lists its runs
//   run          (kv_begin, kv_end, kind) in `runs`: kv_blocks kv_begin <= j < kv_end, all FULL (2: no
//                masking) or all PARTIAL (1: the generated predicate decides); EMPTY blocks are never listed
//   work item    blockIdx.x = w * Hq + h: work_order[w] is the row block (heaviest first), h the query head
//   WARP_M       query rows owned by one warp (16 * M_TILES); each warp computes all BLOCK_N columns
//   g, t         lane / 4 and lane % 4: an mma fragment holds rows g and g + 8, columns 2t and 2t + 1
//   s            scores Q K^T (fp32, raw: not yet scaled)
//   m            running row maximum of s (raw units); l: running row sum of exp2(s*scale_log2 - m*scale_log2)
//   scale_log2   softmax scale * log2(e), so that exp(scale*s) = exp2(scale_log2*s) (one FFMA + one MUFU)
//   acc          the fp32 output accumulator, rescaled by alpha = exp2((m_old - m_new)*scale_log2)
//   LSE          natural-log logsumexp of the scaled scores of a row: (m*scale_log2 + log2 l) * ln 2
//   Shared memory: rows of D elements in 16-byte chunks; chunk c of row r lives at chunk c ^ (r % 8)
//   (XOR swizzle), so the 8 row addresses of one ldmatrix 8x8 matrix fall in 8 different bank groups.
// =====================================================================================================

// ---- constants (from the schedule) -----------------------------------------------------------------
constexpr int HEAD_DIM  = 128;
constexpr int BLOCK_M   = 128;
constexpr int BLOCK_N   = 64;
constexpr int NUM_WARPS = 4;
constexpr bool IS_BF16  = true;   // else fp16

constexpr int NUM_THREADS = NUM_WARPS * 32;
constexpr int WARP_M      = BLOCK_M / NUM_WARPS;   // query rows per warp
constexpr int M_TILES     = WARP_M / 16;           // 16-row mma tiles per warp
constexpr int N_TILES     = BLOCK_N / 8;           // 8-column score tiles per warp
constexpr int D_TILES     = HEAD_DIM / 8;          // 8-column output tiles per warp
constexpr int CHUNKS      = HEAD_DIM / 8;          // 16-byte chunks per shared-memory row
// Q fragments stay in registers when a warp owns one 16-row tile and D <= 128 (32 registers at D = 128);
// otherwise they are re-read from shared memory with ldmatrix at every k-step.
constexpr bool Q_IN_REGS  = M_TILES == 1 && HEAD_DIM <= 128;
constexpr int MIN_CTAS_PER_SM = NUM_WARPS <= 4 ? 2 : 1;

constexpr int Q_TILE_BYTES  = BLOCK_M * HEAD_DIM * 2;
constexpr int KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2;
// Layout: [Q][K buffer 0][K buffer 1][V buffer 0][V buffer 1]
constexpr int SMEM_K_OFFSET = Q_TILE_BYTES;
constexpr int SMEM_V_OFFSET = Q_TILE_BYTES + 2 * KV_TILE_BYTES;
// Interval path (exact masks: mask_visible is only interval tests): the key interval [lo, hi] of every
// region and row of the q_block, computed once per CTA, as int2 [region][row] after the K/V buffers.
constexpr int IV_ALLOW   = 1;
constexpr int IV_REGIONS = 1;
constexpr int SMEM_IV_OFFSET = Q_TILE_BYTES + 4 * KV_TILE_BYTES;
constexpr int SMEM_BYTES    = SMEM_IV_OFFSET + IV_REGIONS * BLOCK_M * 8;
static_assert(BLOCK_N <= 64, "the interval path keeps one 64-bit visibility word per row and tile");

constexpr int KIND_PARTIAL = 1;
constexpr int KIND_FULL    = 2;
static_assert(KIND_PARTIAL == 1 && KIND_FULL == 2, "tile kinds as in maskc.kernel_ir");

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "head dim must be 64, 128 or 256");
static_assert(NUM_WARPS >= 1 && NUM_WARPS <= 16, "1..16 warps");
static_assert(BLOCK_M % (16 * NUM_WARPS) == 0, "each warp owns a whole number of 16-row mma tiles");
static_assert(M_TILES >= 1 && M_TILES <= 2, "at most two 16-row tiles per warp (registers)");
static_assert(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 128, "BLOCK_N is a multiple of 16, <= 128");
static_assert(CHUNKS >= 8, "the XOR swizzle needs rows of at least 8 chunks (128 bytes)");
static_assert((BLOCK_M * CHUNKS) % NUM_THREADS == 0, "Q tile loads split evenly over the threads");
static_assert((BLOCK_N * CHUNKS) % NUM_THREADS == 0, "K/V tile loads split evenly over the threads");
static_assert((WARP_M * CHUNKS) % 32 == 0, "O tile stores split evenly over a warp");
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per CTA on sm_90");
static_assert(SMEM_BYTES == 99328, "the launch gives what maskc.codegen.plan computed");

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
};

__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) {
    MaskRow row;
    const int extent = max(mask[0], mask[1]);
    (void)extent; (void)b; (void)h;
    // allow alibi.mask:7:3: allow k <= q
    row.lo0 = 0;
    row.hi0 = (int)max((maskc_int)-1, min((maskc_int)mask[1] - 1, (maskc_int)q));
    return row;
}

__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) {
    const bool allowed = (k >= row.lo0 && k <= row.hi0);
    return allowed;
}

// ---- end of predicate --------------------------------------------------------------------------------

// ---- the generated score modifier (maskc.codegen.score), verbatim --------------------------------------
// tanh on the SFU (tanh.approx.f32: sm_75+, max relative error 2^-10.99), as FlashAttention-3 soft-caps.
__device__ __forceinline__ float maskc_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// The score modifier: score = score - (slope[h] * (-k + q))
// (applied to a visible pair's scaled score x = scale * s before the softmax; the kernels keep raw s,
// so score_mod returns mod(scale * s) / scale, and score_mod_grad also d = mod'(x))
// q, k: the pair's positions; qf, kf: the same as floats (exact below 2**24), which the caller derives from
// a row's and a tile's first position by adding constants, so that (q - k) costs one add, not a conversion
// Entry i of a float table [n, bits_0 .. bits_n-1], i clamped into [0, n).
__device__ __forceinline__ float maskc_float_at(const int* __restrict__ table, int i) {
    return __int_as_float(table[1 + min(max(i, 0), table[0] - 1)]);
}
struct ScoreHead {
    float scale, inv_scale;
    float f0;
    float f1;
};

__device__ __forceinline__ ScoreHead score_head(const int* __restrict__ mask, int b, int h, float scale) {
    ScoreHead c;
    (void)mask; (void)b; (void)h;
    c.scale = scale;
    c.inv_scale = 1.f / scale;
    const float inv_scale = c.inv_scale;
    (void)inv_scale;
    c.f0 = (maskc_float_at(mask + mask[2], h)) * -inv_scale;
    c.f1 = maskc_float_at(mask + mask[2], h);
    return c;
}

__device__ __forceinline__ float score_mod(const ScoreHead& c, const int* __restrict__ mask, float s, int q, int k, float qf, float kf) {
    (void)mask; (void)q; (void)k; (void)qf; (void)kf; (void)s;
    const float v0 = fmaf(c.f0, (qf - kf), s);
    return v0;
}

__device__ __forceinline__ float score_mod_grad(const ScoreHead& c, const int* __restrict__ mask, float s, int q, int k, float qf, float kf, float& d) {
    (void)mask; (void)q; (void)k; (void)qf; (void)kf; (void)s;
    const float v0 = fmaf(c.f0, (qf - kf), s);
    d = 1.f;
    return v0;
}

// The forward's scores: score_mod less its terms that read no key position (the softmax of a row is
// unchanged by them: score_row gives them back to the LSE), divided by its positive factor
// score_unit (by which the forward multiplies the softmax's scale instead). kfo: the key's position
// less the row's origin (any position of the row's work item, the same for all its keys), exact and
// small near the diagonal.
__device__ __forceinline__ float score_mod_fwd(const ScoreHead& c, const int* __restrict__ mask, float s, int q, int k, float qf, float kf, float kfo) {
    (void)mask; (void)q; (void)k; (void)qf; (void)kf; (void)s; (void)kfo;
    const float v0 = fmaf(c.f0, -kfo, s);
    return v0;
}

// What score_mod_fwd left out, for row q with origin `of`, in natural units: the forward adds it to
// the row's LSE, which is then the LSE of the modified scores.
__device__ __forceinline__ float score_row(const ScoreHead& c, const int* __restrict__ mask, int q, float qf, float of) {
    (void)mask; (void)q; (void)qf; (void)of;
    return -c.f1 * (qf - of);
}

// The forward's scores are score_mod's divided by this, a positive factor (scale > 0 at launch).
__device__ __forceinline__ float score_unit(const ScoreHead& c) {
    (void)c;
    return 1.f;
}


// ---- end of score modifier ---------------------------------------------------------------------------

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

// s <- mod(scale * s) / scale on every pair of the tile (q_row: the query of fragment row g; key0: the tile's
// first key + 2t). One call per kv tile; ScoreHead holds everything that reads neither q, k nor s. Positions
// as floats are the row's and the tile's first plus constants: two conversions per call, none per pair.
// This modifier adds terms that read no key position: they are left out here (score_mod_fwd) and added to the
// LSE at the end (score_row), from `origin`, the work item's first query.
template <int N_TILES>
__device__ __forceinline__ void modify_scores(float (&s)[N_TILES][4], const ScoreHead& sh, const int* __restrict__ mask,
                                              int q_row, int key0, int origin) {
    const float q_rowf = (float)q_row, key0f = (float)key0;
    const float key0f_from_origin = (float)(key0 - origin);
    #pragma unroll
    for (int half = 0; half < 2; ++half)
        #pragma unroll
        for (int nt = 0; nt < N_TILES; ++nt)
            #pragma unroll
            for (int e = 0; e < 2; ++e)
                s[nt][half * 2 + e] = score_mod_fwd(sh, mask, s[nt][half * 2 + e], q_row + 8 * half, key0 + nt * 8 + e,
                                                    q_rowf + (float)(8 * half), key0f + (float)(nt * 8 + e),
                                                    key0f_from_origin + (float)(nt * 8 + e));
}

// This kernel keeps its own masking and softmax code, as measured in run 13 (353 TF/s at 32K causal): with
// the versions the Hopper kernels share (forward_tile.cu.j2) run 14 measured 281 TF/s (bench/NOTES.md).
// Bits a..b (clamped to 0..BLOCK_N-1) of a visibility word; 0 when the interval misses the tile.
__device__ __forceinline__ unsigned long long range_bits(int a, int b) {
    a = max(a, 0);
    b = min(b, BLOCK_N - 1);
    if (a > b) return 0ull;
    return (~0ull >> (63 - b)) & (~0ull << a);
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

// What one warp carries across kv tiles.
struct WarpState {
    float acc[M_TILES][D_TILES][4];   // O accumulator: rows (g, g+8) x columns (2t, 2t+1) per 16x8 tile
    float m[M_TILES][2];              // running max of rows g and g+8 (raw score units)
    float l[M_TILES][2];              // running partial sum of this thread's columns (reduced at the end)
};

// One kv tile: S = Q K^T, mask (PARTIAL tiles and the ragged last tile only), online softmax, acc += P V.
// MASKED: call the predicate; BOUNDS: hide keys k >= kv_len. Both false (a FULL tile) => no masking code.
template <bool MASKED, bool BOUNDS>
__device__ __forceinline__ void attend_tile(
    WarpState& st, const u32 (&q_frag)[HEAD_DIM / 16][4], u32 q_smem, u32 k_smem, u32 v_smem,
    const u32 (&qv_off)[4], const u32 (&k_off)[4],
    int lane, int warp_row0, int q0, int k0, int seq_len, int kv_len,
    const int* __restrict__ mask, int mb, int h, float scale_log2, bool has_next, const int2* iv_smem,
    bool do_mask, bool do_bounds, const ScoreHead& sh) {
    const int g = lane >> 2, t = lane & 3;

    // ---- S = Q K^T (fp32 accumulators) ----
    float s[M_TILES][N_TILES][4];
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
        #pragma unroll
        for (int nt = 0; nt < N_TILES; ++nt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;

    #pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        u32 a[M_TILES][4];
        #pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            if constexpr (Q_IN_REGS) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[kk][e];
            } else {
                // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15
                ldmatrix_x4(a[mt], q_smem + tile_offset(qv_off, warp_row0 + mt * 16, kk));
            }
        }
        #pragma unroll
        for (int np = 0; np < N_TILES / 2; ++np) {
            // Keys np*16 .. +15: matrices (keys 0-7, k lo), (keys 0-7, k hi), (keys 8-15, k lo), (keys 8-15, k hi)
            u32 b[4];
            ldmatrix_x4(b, k_smem + tile_offset(k_off, np * 16, kk));
            #pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                mma_16x8x16(s[mt][2 * np], a[mt], b[0], b[1]);
                mma_16x8x16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }

    // ---- the score modifier, on every pair (masking below then hides what it must) ----
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) modify_scores(s[mt], sh, mask, q0 + warp_row0 + mt * 16 + g, k0 + 2 * t, q0);

    // ---- masking: -inf where the predicate (or the kv_len bound) hides a key ----
    // MASKED/BOUNDS say whether the code exists; do_mask/do_bounds whether it runs for this tile (one
    // instantiation serves every tile kind: one body for the register allocator, a uniform branch per tile).
    if ((MASKED && do_mask) || (BOUNDS && do_bounds)) {
        #pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                if (MASKED && do_mask) {
                    // Interval path: the row's key intervals were computed once per CTA (row_intervals); build
                    // the tile's visibility as a BLOCK_N-bit word (allow ORed, deny cleared), then test bits.
                    const int rr = warp_row0 + mt * 16 + g + half * 8;
                    unsigned long long bits = 0ull;
                    #pragma unroll
                    for (int i = 0; i < IV_ALLOW; ++i) {
                        const int2 v = iv_smem[i * BLOCK_M + rr];
                        bits |= range_bits(v.x - k0, v.y - k0);
                    }
                    #pragma unroll
                    for (int i = IV_ALLOW; i < IV_REGIONS; ++i) {
                        const int2 v = iv_smem[i * BLOCK_M + rr];
                        bits &= ~range_bits(v.x - k0, v.y - k0);
                    }
                    if (BOUNDS && do_bounds) bits &= range_bits(0, kv_len - 1 - k0);
                    bits >>= 2 * t;
                    #pragma unroll
                    for (int nt = 0; nt < N_TILES; ++nt)
                        #pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (!((bits >> (nt * 8 + e)) & 1ull)) s[mt][nt][half * 2 + e] = neg_inf();
                } else {
                    hide_keys<true>(s[mt], half, k0 + 2 * t, kv_len, [](int) { return true; });
                }
            }
        }
    }

    // ---- online softmax: new row max (quad shuffle), rescale, P = exp2(s*scale_log2 - m*scale_log2) ----
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            float mx = st.m[mt][half];
            #pragma unroll
            for (int nt = 0; nt < N_TILES; ++nt)
                mx = fmaxf(mx, fmaxf(s[mt][nt][half * 2], s[mt][nt][half * 2 + 1]));
            // the four threads of a quad (t = 0..3) hold the row's columns
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // A row that has seen no visible key keeps m = -inf; subtract 0 instead, so exp2(-inf) = 0, not NaN.
            const float m_scaled = mx == neg_inf() ? 0.f : mx * scale_log2;
            const float alpha = exp2_approx(st.m[mt][half] * scale_log2 - m_scaled);   // old m = -inf -> 0
            st.m[mt][half] = mx;
            st.l[mt][half] *= alpha;
            #pragma unroll
            for (int dt = 0; dt < D_TILES; ++dt) {
                st.acc[mt][dt][half * 2] *= alpha;
                st.acc[mt][dt][half * 2 + 1] *= alpha;
            }
            float sum = 0.f;
            #pragma unroll
            for (int nt = 0; nt < N_TILES; ++nt) {
                const float p0 = exp2_approx(fmaf(s[mt][nt][half * 2], scale_log2, -m_scaled));
                const float p1 = exp2_approx(fmaf(s[mt][nt][half * 2 + 1], scale_log2, -m_scaled));
                sum += p0 + p1;
                s[mt][nt][half * 2] = p0;
                s[mt][nt][half * 2 + 1] = p1;
            }
            st.l[mt][half] += sum;
        }
    }

    // ---- wait for this tile's V ----
    if (has_next) cp_async_wait<2>(); else cp_async_wait<0>();
    __syncthreads();

    // ---- acc += P V: the packed scores are already the A fragments of P (registers, no shuffle) ----
    #pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        u32 p[M_TILES][4];
        #pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            p[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);          // row g,   keys 2t..
            p[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);          // row g+8, keys 2t..
            p[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);  // row g,   keys 8+2t..
            p[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);  // row g+8, keys 8+2t..
        }
        #pragma unroll
        for (int dp = 0; dp < D_TILES / 2; ++dp) {
            // Transposed: matrices (keys 0-7, d lo), (keys 8-15, d lo), (keys 0-7, d hi), (keys 8-15, d hi)
            u32 b[4];
            ldmatrix_x4_trans(b, v_smem + tile_offset(qv_off, kk * 16, dp));
            #pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                mma_16x8x16(st.acc[mt][2 * dp], p[mt], b[0], b[1]);
                mma_16x8x16(st.acc[mt][2 * dp + 1], p[mt], b[2], b[3]);
            }
        }
    }
}

}  // namespace maskc

// ---- entry -------------------------------------------------------------------------------------------
// Grid: x = work items (len(work_order) * Hq, heaviest row blocks first), y = batch elements when the mask
// is broadcast over the batch (descriptor batch 1), else 1. Block: NUM_THREADS. Dynamic smem: SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(NUM_THREADS, MIN_CTAS_PER_SM) maskc_fwd_alibi(
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
    float scale_log2) {
    using namespace maskc;
    extern __shared__ __align__(128) unsigned char smem[];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.x % num_heads;
    const int r = work_order[blockIdx.x / num_heads];           // row block
    const int q_blocks = (seq_len + BLOCK_M - 1) / BLOCK_M;
    const int mb = r / q_blocks;                                 // the mask's batch element
    const int b = mask_batch == 1 ? (int)blockIdx.y : mb;        // the data's batch element
    const int q0 = (r % q_blocks) * BLOCK_M;
    const int hk = h / (num_heads / num_kv_heads);
    const int warp_row0 = warp * WARP_M;

    const u16* q_base = q + b * q_sb + h * q_sh;
    const u16* k_base = k + b * k_sb + hk * k_sh;
    const u16* v_base = v + b * v_sb + hk * v_sh;
    const int* mask = mask_data + mask_offsets[mb];
    const ScoreHead sh = score_head(mask, mb, h, scale_log2 * LN2);    // the score modifier's per-head constants

    const u32 smem0 = smem_address(smem);
    const u32 q_smem = smem0;

    // ---- prologue: Q (own group), then K and V of the first tile (one group each) ----
    load_tile<BLOCK_M, NUM_THREADS>(q_smem, q_base, q_ss, q0, seq_len, tid);
    cp_async_commit();

    int run = run_offsets[r];
    const int run_end = run_offsets[r + 1];
    int kv_block = 0, kv_end = 0, kind = 0;
    if (run < run_end) {
        kv_block = runs[3 * run]; kv_end = runs[3 * run + 1]; kind = runs[3 * run + 2];
        load_tile<BLOCK_N, NUM_THREADS>(smem0 + SMEM_K_OFFSET, k_base, k_ss, kv_block * BLOCK_N, kv_len, tid);
        cp_async_commit();
        load_tile<BLOCK_N, NUM_THREADS>(smem0 + SMEM_V_OFFSET, v_base, v_ss, kv_block * BLOCK_N, kv_len, tid);
        cp_async_commit();
    }

    const int2* iv_smem = nullptr;
    // Each row's key intervals, once per CTA (rows past seq_len are clamped: computed, never stored).
    iv_smem = reinterpret_cast<const int2*>(smem + SMEM_IV_OFFSET);
    for (int rr = tid; rr < BLOCK_M; rr += NUM_THREADS) {
        const int qrow = min(q0 + rr, seq_len - 1);
        const MaskRow row = mask_row(mask, mb, h, qrow);
        int2* iv_w = reinterpret_cast<int2*>(smem + SMEM_IV_OFFSET);
        iv_w[0 * BLOCK_M + rr] = make_int2(row.lo0, row.hi0);
    }
    (void)iv_smem;

    // Q and V fragments: lane reads row (lane % 16), chunk x = lane / 16; K: row (lane % 8) + 8 * (lane / 16),
    // chunk x = (lane / 8) % 2 (see attend_tile for which 8x8 matrix each lane group addresses)
    u32 qv_off[4], k_off[4];
    lane_offsets(qv_off, lane & 15, lane >> 4);
    lane_offsets(k_off, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

    u32 q_frag[HEAD_DIM / 16][4];
    if constexpr (Q_IN_REGS) {
        if (run < run_end) cp_async_wait<2>(); else cp_async_wait<0>();
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
            ldmatrix_x4(q_frag[kk], q_smem + tile_offset(qv_off, warp_row0, kk));
    }

    WarpState st;
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) { st.m[mt][half] = neg_inf(); st.l[mt][half] = 0.f; }
        #pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) st.acc[mt][dt][e] = 0.f;
    }

    // ---- main loop over the row block's kv tiles, run by run; buffer `stage` holds the current tile ----
    int stage = 0;
    while (run < run_end) {
        // the tile after this one (the next block of this run, or the first of the next run)
        int next_run = run, next_block = kv_block + 1, next_end = kv_end, next_kind = kind;
        if (next_block == kv_end && ++next_run < run_end) {
            next_block = runs[3 * next_run]; next_end = runs[3 * next_run + 1]; next_kind = runs[3 * next_run + 2];
        }
        const bool has_next = next_run < run_end;

        // wait for this tile's K (V may still be in flight); after the barrier every warp has finished the
        // previous tile, so its buffers (stage ^ 1) can be refilled with the next tile
        cp_async_wait<1>();
        __syncthreads();
        if (has_next) {
            // the bases are rebuilt from the kernel parameters (constant bank) rather than kept live in registers
            load_tile<BLOCK_N, NUM_THREADS>(smem0 + SMEM_K_OFFSET + (stage ^ 1) * KV_TILE_BYTES, k + (b * k_sb + hk * k_sh), k_ss,
                               next_block * BLOCK_N, kv_len, tid);
            cp_async_commit();
            load_tile<BLOCK_N, NUM_THREADS>(smem0 + SMEM_V_OFFSET + (stage ^ 1) * KV_TILE_BYTES, v + (b * v_sb + hk * v_sh), v_ss,
                               next_block * BLOCK_N, kv_len, tid);
            cp_async_commit();
        }

        const u32 k_smem = smem0 + SMEM_K_OFFSET + stage * KV_TILE_BYTES;
        const u32 v_smem = smem0 + SMEM_V_OFFSET + stage * KV_TILE_BYTES;
        const int k0 = kv_block * BLOCK_N;
        const bool ragged = k0 + BLOCK_N > kv_len;   // only the last kv_block can be
        attend_tile<true, true>(st, q_frag, q_smem, k_smem, v_smem, qv_off, k_off, lane, warp_row0, q0, k0,
                                seq_len, kv_len, mask, mb, h, scale_log2, has_next, iv_smem, kind != KIND_FULL, ragged,
                                sh);
        run = next_run; kv_block = next_block; kv_end = next_end; kind = next_kind;
        stage ^= 1;
    }

    // ---- epilogue: finish the row sums, normalize, write LSE and O (staged through this warp's Q rows) ----
    cp_async_wait<0>();   // a row block without runs still has its Q copy in flight
    __syncthreads();
    #pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            float l = st.l[mt][half];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            // l == 0: the row saw no visible key -> O = 0, LSE = -inf
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int row = warp_row0 + mt * 16 + g + half * 8;
            if (lse != nullptr && t == 0 && q0 + row < seq_len) {
                const float m_scaled = st.m[mt][half] * scale_log2;
                lse[((long long)b * num_heads + h) * seq_len + q0 + row] =
                    l > 0.f ? (m_scaled + __log2f(l)) * LN2
                                  + score_row(sh, mask, q0 + row, (float)(q0 + row), (float)q0) : neg_inf();
            }
            #pragma unroll
            for (int dt = 0; dt < D_TILES; ++dt) {
                const u32 packed = pack2(st.acc[mt][dt][half * 2] * inv, st.acc[mt][dt][half * 2 + 1] * inv);
                asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(q_smem + swizzle(row, dt) + 4 * t), "r"(packed));
            }
        }
    }
    __syncwarp();
    u16* o_base = o + b * o_sb + h * o_sh;
    #pragma unroll
    for (int i = 0; i < WARP_M * CHUNKS / 32; ++i) {
        const int c = lane + i * 32;
        const int row = warp_row0 + c / CHUNKS, chunk = c % CHUNKS;
        if (q0 + row < seq_len) {
            u32 x0, x1, x2, x3;
            asm volatile("ld.shared.v4.u32 { %0, %1, %2, %3 }, [%4];\n"
                         : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(q_smem + swizzle(row, chunk)));
            u16* dst = o_base + (long long)(q0 + row) * o_ss + chunk * 8;
            asm volatile("st.global.v4.u32 [%0], { %1, %2, %3, %4 };\n"
                         :: "l"(dst), "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
        }
    }
}
