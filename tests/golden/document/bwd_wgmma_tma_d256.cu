// =====================================================================================================
// maskc: flash-attention backward, specialized to the mask `document`
//   mask document (document.mask:2:6)
//   allow same(docs), k <= q
//
// Four kernels, launched in this order by maskc.runtime.attention_backward:
//   maskc_bwd_prep_document       per query row: LSE in log2 units, and delta = rowsum(dO * O) - dLSE
//   maskc_bwd_dkdv_document       key-tile-major: one CTA per (kv_block, kv head, batch element) walks the
//                               descriptor's transposed runs (the q_blocks that see its keys) for every query
//                               head of its GQA group; dK and dV stay in registers, so they are summed over
//                               the group without atomics. It also adds dQ's partial products into an fp32
//                               buffer with atomics (the fast mode).
//   maskc_bwd_dkdv_det_document   the same without dQ (the deterministic mode) ...
//   maskc_bwd_dq_document         ... which computes dQ query-tile-major instead, like the forward: no atomics,
//                               bitwise repeatable, at the price of recomputing Q K^T and dO V^T once more.
//   maskc_bwd_dq_convert_document fp32 dQ buffer * scale -> the input dtype (fast mode)
//
// Notation (as in the forward kernel): S, Skv query and key lengths; D = HEAD_DIM; P = softmax(scale Q K^T)
// recomputed from the forward's LSE; dP = dO V^T; dS = P * (dP - delta); dV = P^T dO; dK = scale dS^T Q;
// dQ = scale dS K. Tiles: Q_BLOCK queries x KV_BLOCK keys in the dK/dV kernel, Q_BLOCK x DQ_KV_BLOCK in
// the dQ kernel. An mma fragment holds rows g and g + 8, columns 2t and 2t + 1 (g = lane / 4, t = lane % 4).
// In the dK/dV kernel warps own 16 key rows each, so its score tiles are transposed: S^T = K Q^T.
// Masking: a PARTIAL tile first writes its visibility as bits (one u32 per row and 32 keys) to shared
// memory; FULL tiles run no masking code; EMPTY tiles are never visited.
// The dK/dV kernel has two engines: mma.sync (bwd_dkdv_mma.cu.j2) and Hopper warpgroup products on
// 128B-swizzled tiles (bwd_dkdv_wgmma.cu.j2). This source's: wgmma_tma.
// =====================================================================================================

// ---- constants (from the schedule) -----------------------------------------------------------------
constexpr int HEAD_DIM    = 256;
constexpr bool IS_BF16    = true;   // else fp16
constexpr int CHUNKS      = HEAD_DIM / 8;          // 16-byte chunks per row of a Q/K/V/dO tile
constexpr int D_TILES     = HEAD_DIM / 8;          // 8-column output tiles

constexpr int Q_BLOCK     = 64;    // queries per step (dK/dV) and per CTA (dQ)
constexpr int KV_BLOCK    = 64;    // keys per CTA of the dK/dV kernel
constexpr int DQ_KV_BLOCK = 32; // keys per step of the dQ kernel

// dK/dV on Hopper at head dim 256: the two warpgroups share the block's keys, each taking half of every step's
// queries (S^T, dP^T) and half of the head dim (dK, dV, dQ); P^T and dS^T pass through shared memory
constexpr bool SPLIT_HEAD_DIM = true;
constexpr int KV_WARPS    = SPLIT_HEAD_DIM ? 8 : KV_BLOCK / 16;   // dK/dV: each warp owns 16 key rows
constexpr int KV_THREADS  = KV_WARPS * 32;         // ... its consumer threads
constexpr int DKDV_THREADS = 384;        // the dK/dV kernel's block: KV_THREADS (+ a producer warpgroup)
constexpr int Q_TILES     = Q_BLOCK / 8;           // dK/dV: 8-query score tiles per step
constexpr int WG_Q_TILES  = SPLIT_HEAD_DIM ? Q_TILES / 2 : Q_TILES;   // ... of them per warp
constexpr int WG_D_TILES  = SPLIT_HEAD_DIM ? D_TILES / 2 : D_TILES;   // 8-column tiles of a warp's dK and dV
constexpr int Q_CHUNKS    = Q_BLOCK / 8;           // 16-byte chunks per row of the dS^T tile

constexpr int DQ_WARPS    = Q_BLOCK / 16;          // dQ kernel: each warp owns 16 query rows
constexpr int DQ_THREADS  = DQ_WARPS * 32;
constexpr int DQ_K_TILES  = DQ_KV_BLOCK / 8;       // dQ kernel: 8-key score tiles per warp

constexpr int PREP_WARPS  = 8;                     // prep kernel: one warp per query row
// LSE_log2, delta and the fp32 dQ buffer: rows per (batch, head) rounded up to ROW_PAD, so that a step's rows
// are whole and aligned
constexpr int ROW_PAD     = 64;
static_assert(ROW_PAD % 64 == 0 && ROW_PAD % Q_BLOCK == 0, "whole steps and 64-row dQ tiles in the padded rows");

constexpr int KIND_PARTIAL = 1;
constexpr int KIND_FULL    = 2;

// Shared memory (byte offsets from maskc.codegen.plan.backward_layout).
// dK/dV kernel: [K][V][Q x2][dO x2][dS^T][LSE x2][delta x2][visibility bits][dQ staging (bulk_tile reduction)]
// [P^T (SPLIT_HEAD_DIM)]
constexpr int KV_SMEM_K     = 0;
constexpr int KV_SMEM_V     = 32768;
constexpr int KV_SMEM_Q     = 65536;
constexpr int KV_SMEM_DO    = 131072;
constexpr int KV_SMEM_DS    = 196608;
constexpr int KV_SMEM_LSE   = 229376;
constexpr int KV_SMEM_DELTA = 229888;
constexpr int KV_SMEM_BITS  = 230400;
constexpr int KV_SMEM_PT    = 212992;
constexpr int KV_SMEM_BARS  = 230912;
constexpr int KV_SMEM_BYTES = 232064;
// dQ kernel: [Q][dO][K x2][V x2][visibility bits]
constexpr int DQ_SMEM_Q     = 0;
constexpr int DQ_SMEM_DO    = 32768;
constexpr int DQ_SMEM_K     = 65536;
constexpr int DQ_SMEM_V     = 98304;
constexpr int DQ_SMEM_BITS  = 131072;
constexpr int DQ_SMEM_BYTES = 131328;

constexpr int Q_TILE_BYTES  = Q_BLOCK * HEAD_DIM * 2;
constexpr int DQ_KV_TILE_BYTES = DQ_KV_BLOCK * HEAD_DIM * 2;

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || (HEAD_DIM == 256 && SPLIT_HEAD_DIM),
              "backward: head dim 64 or 128, or 256 with the warpgroups splitting it");
static_assert(KV_BLOCK % 16 == 0 && Q_BLOCK % 16 == 0 && DQ_KV_BLOCK % 32 == 0, "tile shapes");
static_assert(KV_BLOCK % 32 == 0 && Q_CHUNKS >= 8, "visibility words; the dS^T swizzle needs >= 8 chunks per row");
static_assert(KV_SMEM_BYTES <= 227 * 1024 && DQ_SMEM_BYTES <= 227 * 1024, "shared memory per CTA on sm_90");

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
    const MaskSegment seg0_q = maskc_segment(mask + mask[2], q, extent);
    // allow document.mask:3:3: allow same(docs), k <= q
    row.lo0 = (int)min((maskc_int)mask[1], max((maskc_int)0, (maskc_int)seg0_q.start));
    row.hi0 = (int)max((maskc_int)-1, min(min((maskc_int)mask[1] - 1, (maskc_int)q), (maskc_int)((maskc_int)seg0_q.end - 1)));
    if (!(-(maskc_int)seg0_q.index <= 0)) { row.lo0 = 1; row.hi0 = 0; }   // row guard fails
    return row;
}

__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, int k) {
    const bool allowed = (k >= row.lo0 && k <= row.hi0);
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

// d[64 x 32] (+)= A[64 x 16] * B[16 x 32], fp32 accumulators (this thread: d[j][*] = rows g, g+8 of its warp's
// 16, columns 8j + 2t, +1). A and B from shared memory (SS) or A from registers (RS, the m16n8k16 A fragment).
// TRANS_B (TRANS_A): B (A) is MN-major in shared memory, i.e. stored as its transpose.
template <int TRANS_B, int TRANS_A = 0>
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[4][4], unsigned long long a_desc,
                                             unsigned long long b_desc, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 }, "
        "%16, %17, p, 1, 1, %20, %19;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(a_desc), "l"(b_desc), "r"((int)accumulate), "n"(TRANS_B), "n"(TRANS_A));
}
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_n32(float (&d)[4][4], const u32 (&a)[4],
                                             unsigned long long b_desc, bool accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15 }, "
        "{ %16, %17, %18, %19 }, %20, p, 1, 1, %22;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"((int)accumulate), "n"(TRANS_B));
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

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000u); }

// Rows per (batch, head) of the LSE_log2 and delta buffers (and of the fp32 dQ buffer): seq_len rounded up to
// ROW_PAD. The prep kernel writes the padding rows as LSE = +inf, delta = 0 (so that their P is 0).
__device__ __forceinline__ int padded_rows(int seq_len) { return (seq_len + ROW_PAD - 1) / ROW_PAD * ROW_PAD; }

// The two 16-bit values of a 32-bit word as floats (low half first).
__device__ __forceinline__ float2 unpack2(u32 x) {
    if constexpr (IS_BF16) return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    float lo, hi;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(x));
    return make_float2(lo, hi);
}

// 4-byte global -> shared copy (LSE, delta); src_bytes = 0 writes zero.
__device__ __forceinline__ void cp_async_4(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}

// dst[0] += a, dst[1] += b in one vector reduction (sm_90; dst 8-byte aligned): half the atomics of two adds.
__device__ __forceinline__ void red_add_f32x2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], { %1, %2 };\n" :: "l"(dst), "f"(a), "f"(b) : "memory");
#else   // vector reductions are sm_90's: two scalar ones before
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
#endif
}// Visibility of the ROWS x COLS tile at (q0, k0): bits[row * (COLS / 32) + word], bit j = key k0 + 32 word + j.
// Rows past seq_len and keys past kv_len are hidden. THREADS threads share the words (whole warps, all of them
// calling). roots: the root tables mask_bits reads (tile path), or null.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void tile_visibility(u32* bits, const int* __restrict__ mask, int mb, int h, int q0,
                                                int k0, int seq_len, int kv_len, int tid, const int* roots) {
    (void)roots;
    constexpr int WORDS = COLS / 32;
    for (int i = tid; i < ROWS * WORDS; i += THREADS) {
        const int row = i / WORDS, key0 = k0 + (i % WORDS) * 32;
        const int q = q0 + row;
        u32 word = 0u;
        if (q < seq_len) {
            const MaskRow mr = mask_row(mask, mb, h, q);
            // interval masks: each region's [lo, hi] becomes a run of bits
            word |= maskc_span_bits<u32>(mr.lo0 - key0, mr.hi0 - key0);
            word &= maskc_span_bits<u32>(0, kv_len - 1 - key0);
        }
        bits[i] = word;
    }
}

// One fragment-ordered pass of a 16 x (8 N) score tile: s[n][e] += A(16 x D rows at a_smem) * B^T, where B
// is N * 8 rows of D elements at b_smem (both swizzled tiles of HEAD_DIM columns).
template <int N>
__device__ __forceinline__ void scores_16xN(float (&s)[N][4], u32 a_smem, int a_row0, const u32 (&a_off)[4],
                                            u32 b_smem, const u32 (&b_off)[4]) {
    #pragma unroll
    for (int n = 0; n < N; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
    #pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        u32 a[4];
        ldmatrix_x4(a, a_smem + tile_offset(a_off, a_row0, kk));
        #pragma unroll
        for (int np = 0; np < N / 2; ++np) {
            u32 b[4];
            ldmatrix_x4(b, b_smem + tile_offset(b_off, np * 16, kk));
            mma_16x8x16(s[2 * np], a, b[0], b[1]);
            mma_16x8x16(s[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 x D) += X (16 x 8 N, fp32 fragments in x, rounded to 16 bits) * Y (8 N rows of D elements at
// y_smem, read transposed). The fragments of a score tile are the A fragments of this product.
template <int N>
__device__ __forceinline__ void accumulate_16xD(float (&acc)[D_TILES][4], const float (&x)[N][4], u32 y_smem,
                                                const u32 (&y_off)[4]) {
    u32 a[N / 2][4];
    pack_a_fragments(a, x);
    #pragma unroll
    for (int kk = 0; kk < N / 2; ++kk)
        #pragma unroll
        for (int dp = 0; dp < D_TILES / 2; ++dp) {
            u32 b[4];
            ldmatrix_x4_trans(b, y_smem + tile_offset(y_off, kk * 16, dp));
            mma_16x8x16(acc[2 * dp], a[kk], b[0], b[1]);
            mma_16x8x16(acc[2 * dp + 1], a[kk], b[2], b[3]);
        }
}

// Write a warp's 16 x 8 DT fp32 fragments (times `scale`, rounded) to global rows row0 + (0..15), columns
// 8 chunk0 .. of `dst` (row stride HEAD_DIM elements, rows >= rows_valid skipped), staged through those rows
// and columns of the swizzled tile at `stage` so that the global stores are 16 bytes wide.
template <int DT>
__device__ __forceinline__ void store_rows_16xD(const float (&acc)[DT][4], float scale, u32 stage,
                                                int stage_row0, u16* __restrict__ dst, int row0, int rows_valid,
                                                int lane, int chunk0 = 0) {
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int half = 0; half < 2; ++half)
        #pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            const u32 packed = pack2(acc[dt][half * 2] * scale, acc[dt][half * 2 + 1] * scale);
            asm volatile("st.shared.u32 [%0], %1;\n"
                         :: "r"(stage + swizzle(stage_row0 + g + half * 8, chunk0 + dt) + 4 * t), "r"(packed));
        }
    __syncwarp();
    #pragma unroll
    for (int i = 0; i < 16 * DT / 32; ++i) {
        const int c = lane + i * 32;
        const int row = c / DT, chunk = chunk0 + c % DT;
        if (row0 + row < rows_valid) {
            u32 x0, x1, x2, x3;
            asm volatile("ld.shared.v4.u32 { %0, %1, %2, %3 }, [%4];\n"
                         : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(stage + swizzle(stage_row0 + row, chunk)));
            asm volatile("st.global.v4.u32 [%0], { %1, %2, %3, %4 };\n"
                         :: "l"(dst + (long long)(row0 + row) * HEAD_DIM + chunk * 8),
                            "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
        }
    }
}

// Where the dK/dV kernel is in its walk: query head gi of the GQA group, transposed run `run`, q_block qb.
struct ColumnStep {
    int gi, run, qb, q_end, kind;
};

__device__ __forceinline__ void read_run(ColumnStep& s, const int* __restrict__ runs) {
    s.qb = runs[3 * s.run]; s.q_end = runs[3 * s.run + 1]; s.kind = runs[3 * s.run + 2];
}

// The walk's first step: the first q_block of the first run for the group's first head; with no runs (no
// query sees these keys: dK = dV = 0) a step past the last head.
__device__ __forceinline__ ColumnStep first_step(int run_begin, int run_end, int group, const int* __restrict__ runs) {
    ColumnStep s{0, run_begin, 0, 0, 0};
    if (run_begin < run_end) read_run(s, runs);
    else s.gi = group;
    return s;
}

// The step after `s`: the next q_block of the run, else the next run, else the next head's first run.
__device__ __forceinline__ ColumnStep next_step(ColumnStep s, int run_begin, int run_end, int group,
                                                const int* __restrict__ runs) {
    if (++s.qb < s.q_end) return s;
    if (++s.run == run_end) { s.run = run_begin; ++s.gi; }
    if (s.gi < group) read_run(s, runs);
    return s;
}

// A dK/dV kernel's work item: key block `column` (mb * kv_blocks + the block) of kv head hk, whose keys k0 ..
// k0 + KV_BLOCK - 1 the `group` query heads hk * group .. see.
struct KeyBlock {
    int hk, column, mb, b, k0, group;
};

// This CTA's (head, block) when the grid's x covers `blocks` blocks of `heads` heads: first the `front` first
// blocks of the order given (heaviest first), each for every head (blocks so long that, started in the last
// section, they would end well after the rest: maskc.runs.front_rows), then the others in L2 sections of
// `section_heads` heads: a section's blocks in the order given, each for the section's heads in turn. The CTAs
// resident together then read the Q, dO and dQ (or K and V) of few heads, which stay in L2.
struct HeadSlot {
    int head, slot;
};

__device__ __forceinline__ HeadSlot head_and_slot(int heads, int section_heads, int front) {
    const int cta = blockIdx.x;
    if (cta < front * heads) return {cta % heads, cta / heads};
    const int blocks = gridDim.x / heads - front, rest = cta - front * heads;
    const int section = rest / (blocks * section_heads);
    const int first = section * section_heads;
    const int here = min(section_heads, heads - first);
    const int j = rest - section * blocks * section_heads;
    return {first + j % here, front + j / here};
}

__device__ __forceinline__ KeyBlock key_block(const int* __restrict__ col_order, int num_heads, int num_kv_heads,
                                              int kv_len, int mask_batch, int section_heads, int front_columns) {
    KeyBlock kb;
    const HeadSlot hs = head_and_slot(num_kv_heads, section_heads, front_columns);
    kb.hk = hs.head;
    kb.column = col_order[hs.slot];
    const int kv_blocks = (kv_len + KV_BLOCK - 1) / KV_BLOCK;
    kb.mb = kb.column / kv_blocks;
    kb.b = mask_batch == 1 ? (int)blockIdx.y : kb.mb;
    kb.k0 = (kb.column % kv_blocks) * KV_BLOCK;
    kb.group = num_heads / num_kv_heads;
    return kb;
}

// P^T = exp2(S^T scale_log2 - LSE_log2) in place of S^T, for one warp's 16 keys (rows key_row0 + g, + 8 of
// the key block) and 8 QT of the step's queries (columns 8n + 2t, + 1; all Q_BLOCK of them, or a warpgroup's
// half with lse_row, bits and q0 advanced to it); when `masked`, pairs the visibility bits hide become 0.
// lse_row: LSE_log2 per query (0 for rows past seq_len, whose zero-filled Q and dO rows add nothing to dV, dK
// or dQ).
template <int QT>
__device__ __forceinline__ void transposed_probabilities(float (&p)[QT][4], const float* lse_row,
                                                         const u32* bits, bool masked, int key_row0, int lane,
                                                         float scale_log2) {
    constexpr int WORDS = KV_BLOCK / 32;
    const int g = lane >> 2, t = lane & 3;
    // One loop per kind of step, so that a FULL step runs no masking code at all (with a runtime `masked` in the
    // loop, the compiler loads and tests the bits of every pair and selects: run 45's SASS counts).
    if (masked) {
        #pragma unroll
        for (int nt = 0; nt < QT; ++nt) {
            const float2 lse2 = *reinterpret_cast<const float2*>(lse_row + nt * 8 + 2 * t);
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qc = nt * 8 + 2 * t + (e & 1), kr = key_row0 + g + (e >> 1) * 8;
                float x = exp2_approx(fmaf(p[nt][e], scale_log2, -((e & 1) ? lse2.y : lse2.x)));
                if (!((bits[qc * WORDS + (kr >> 5)] >> (kr & 31)) & 1u)) x = 0.f;
                p[nt][e] = x;
            }
        }
    } else {
        #pragma unroll
        for (int nt = 0; nt < QT; ++nt) {
            const float2 lse2 = *reinterpret_cast<const float2*>(lse_row + nt * 8 + 2 * t);
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = exp2_approx(fmaf(p[nt][e], scale_log2, -((e & 1) ? lse2.y : lse2.x)));
                p[nt][e] = x;
            }
        }
    }
}

// dS^T = P^T * (dP^T - delta) in place of dP^T (same fragments as transposed_probabilities).
template <int QT>
__device__ __forceinline__ void transposed_ds(float (&ds)[QT][4], const float (&p)[QT][4], const float* delta_row,
                                              int lane) {
    const int t = lane & 3;
    #pragma unroll
    for (int nt = 0; nt < QT; ++nt) {
        const float2 d2 = *reinterpret_cast<const float2*>(delta_row + nt * 8 + 2 * t);
        #pragma unroll
        for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - ((e & 1) ? d2.y : d2.x));
    }
}

// Per-step query-side loads of the dK/dV kernel: Q, dO (16-byte cp.async, in the engine's tile layout),
// LSE and delta (4-byte).
__device__ __forceinline__ void load_query_step(u32 smem0, int stage, const u16* __restrict__ q, const u16* __restrict__ dout,
                                                const float* __restrict__ lse_log2, const float* __restrict__ delta,
                                                long long q_sb, long long q_sh, long long q_ss,
                                                long long do_sb, long long do_sh, long long do_ss,
                                                int b, int h, int num_heads, int q0, int seq_len, int tid) {
    load_tile_sw128<Q_BLOCK, KV_THREADS>(smem0 + KV_SMEM_Q + stage * Q_TILE_BYTES, q + b * q_sb + h * q_sh,
                                   q_ss, q0, seq_len, tid);
    load_tile_sw128<Q_BLOCK, KV_THREADS>(smem0 + KV_SMEM_DO + stage * Q_TILE_BYTES, dout + b * do_sb + h * do_sh,
                                   do_ss, q0, seq_len, tid);
    const long long row0 = ((long long)b * num_heads + h) * padded_rows(seq_len) + q0;
    for (int i = tid; i < 2 * Q_BLOCK; i += KV_THREADS) {
        const int r = i % Q_BLOCK;
        const bool valid = q0 + r < seq_len;
        const float* src = (i < Q_BLOCK ? lse_log2 : delta) + (valid ? row0 + r : 0);
        const u32 dst = smem0 + (i < Q_BLOCK ? KV_SMEM_LSE : KV_SMEM_DELTA) + (stage * Q_BLOCK + r) * 4;
        cp_async_4(dst, src, valid ? 4 : 0);
    }
}// The parameters every dK/dV kernel takes, named once: each engine's dkdv_kernel (wgmma_tma's adds its own after
// them) and the entries below.
#define MASKC_DKDV_PARAMS                                                                                        \
    const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,                                  \
    const unsigned short* __restrict__ v, const unsigned short* __restrict__ dout,                               \
    const float* __restrict__ lse_log2, const float* __restrict__ delta,                                         \
    unsigned short* __restrict__ dk, unsigned short* __restrict__ dv, float* __restrict__ dq_accum,              \
    long long q_sb, long long q_sh, long long q_ss, long long k_sb, long long k_sh, long long k_ss,              \
    long long v_sb, long long v_sh, long long v_ss, long long do_sb, long long do_sh, long long do_ss,           \
    int num_heads, int num_kv_heads, int seq_len, int kv_len, int mask_batch, int section_heads,                 \
    int front_columns, const int* __restrict__ col_offsets, const int* __restrict__ col_runs,                    \
    const int* __restrict__ col_order, const int* __restrict__ mask_data, const int* __restrict__ mask_offsets,  \
    float scale, float scale_log2

// ---- dK/dV, warp-specialized: wgmma fed by the copy engine ----------------------------------------------
// The walk, masking and arithmetic of the other engines, on the products of bwd_wgmma_products.cu.j2; what
// differs is who does what (FlashAttention-3's layout of the work):
//   consumers  KV_THREADS threads, two warpgroups (keys 64 wg .., or at head dim 256 all 64 keys, each warpgroup
//              half of the columns), run the products and the pointwise steps;
//              they never load anything and never wait for the producer's warps beyond the stage barriers.
//   producer   the last warpgroup. Its warp 0 asks the copy engine for K and V once (kv_full), then for each
//              step's Q and dO tiles (tensor maps, 128B swizzle) and its 64 LSE and delta values (plain bulk
//              copies of the padded rows) into stage i % 2 (q_full), once the consumers have let go of the
//              stage's previous step (q_empty: one arrival per consumer warp). Its warp 1 adds dQ (bulk_tile;
//              at head dim 256 the consumers add their dQ with vector reductions, red2): each
//              warpgroup stages its 64 x DQ_COLS tile of dS K in shared memory (DQ_FULL + wg) and goes on
//              with dK; the dQ warp hands the tile to the copy engine as one bulk reduction into the fp32
//              buffer and frees the staging tile (DQ_EMPTY + wg) as soon as the engine has read it.
//   stages     Q, dO, LSE, delta, the visibility bits and the dS^T (and P^T) tiles have two stages: a consumer
//              warp can only reach step i + 2 after the producer loaded it, which waits for every consumer warp
//              to finish step i; so nothing of step i is overwritten while a slower warp still reads it. At
//              head dim 256 the bits have one (shared memory is short): they are read before the step's
//              sync_warpgroups, which a warp passes only once every warp is done reading them.
// ---- dK/dV products on Hopper -----------------------------------------------------------------------
// Two warpgroups sharing the block's 64 keys (warp w owns keys 16 (w % 4) ..: wgmma's accumulator rows), as
// FA3 splits head dim 256: 64 keys x 256 columns of dK and dV would be 256 fp32 per thread. Per step, for
// warpgroup wg (all tiles 128B-swizzled in shared memory, the layout wgmma reads):
//   S^T  = K Q_wg^T       SS, m64 n32: the step's queries 32 wg ..   dP^T = V dO_wg^T, issued right behind
//   P^T, dS^T             to shared memory (both warpgroups' halves make the 64 x 64 tiles)
//   dV  += P^T dO         SS, columns wg * HEAD_DIM / 2 .. (dO read MN-major)
//   dK  += dS^T Q         SS, the same columns (Q read MN-major)
//   dQ   = dS K           SS: dS^T read MN-major as A; the same columns of dQ, which the kernel adds to the
//                         fp32 buffer.
static_assert(KV_BLOCK == 64 && Q_BLOCK == 64, "wgmma dK/dV: two warpgroups sharing 64 keys, 64 queries per step");
constexpr int DQ_COLS = HEAD_DIM / 2;              // dQ columns per warpgroup

// The products below build one descriptor per operand and step through the tile from it (sw128_desc_plus).
// S^T (or dP^T) of one warpgroup: the KV tile at kv_tile (K or V) times its half of the step's queries (rows
// 32 wg .. of the Q_BLOCK x D tile at query_tile, Q or dO), transposed. Both operands K-major.
__device__ __forceinline__ void transposed_scores(float (&s)[WG_Q_TILES][4], u32 kv_tile, int wg, u32 query_tile) {
    const unsigned long long a0 = sw128_desc(kv_tile, 16, 1024);
    const unsigned long long b0 = sw128_desc(query_tile + wg * (Q_BLOCK / 2) * 128, 16, 1024);   // its queries
    #pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        // k-step kk: column block kk / 4, 32 bytes per step inside it
        const u32 step = (kk & 3) * 32;
        wgmma_ss_n32<0>(s, sw128_desc_plus(a0, (kk >> 2) * KV_BLOCK * 128 + step),
                                 sw128_desc_plus(b0, (kk >> 2) * Q_BLOCK * 128 + step), kk > 0);
    }
}
// acc (the block's 64 keys x DQ_COLS columns from col0) += X (the 64 keys x Q_BLOCK queries tile at x_tile, P^T
// or dS^T, K-major) * those columns of the Q_BLOCK x D tile at query_tile (dO for dV, Q for dK), read MN-major.
__device__ __forceinline__ void accumulate_keys(float (&acc)[WG_D_TILES][4], u32 x_tile, u32 query_tile, int col0) {
    const unsigned long long a0 = sw128_desc(x_tile, 16, 1024);
    // column blocks Q_BLOCK * 128 bytes apart
    const unsigned long long b0 = sw128_desc(query_tile + (col0 / 64) * Q_BLOCK * 128, Q_BLOCK * 128, 1024);
    #pragma unroll
    for (int kk = 0; kk < Q_BLOCK / 16; ++kk)    // queries 16kk .. 16kk+15: 32 bytes of X's rows, 16 rows of the tile
        wgmma_ss_n128<1>(acc, sw128_desc_plus(a0, kk * 32), sw128_desc_plus(b0, kk * 16 * 128), true);
}

// dQ[:, DQ_COLS columns from col0] = dS K for the step: dS^T (KV_BLOCK keys x Q_BLOCK queries, one 128-byte
// column block) read MN-major as A, the K tile read MN-major as B.
__device__ __forceinline__ void dq_product(float (&dq)[DQ_COLS / 8][4], u32 ds_tile, u32 k_tile, int col0) {
    // column col0 of the K tile: its column block, then 2 bytes per element inside the 128-byte row
    const unsigned long long a0 = sw128_desc(ds_tile, KV_BLOCK * 128, 1024);
    const unsigned long long b0 = sw128_desc(k_tile + (col0 / 64) * KV_BLOCK * 128 + (col0 % 64) * 2, KV_BLOCK * 128, 1024);
    #pragma unroll
    for (int kk = 0; kk < KV_BLOCK / 16; ++kk)
        wgmma_ss_n128<1, 1>(dq, sw128_desc_plus(a0, kk * 16 * 128), sw128_desc_plus(b0, kk * 16 * 128), kk > 0);
}

// This warp's dS^T (or P^T) rows (keys key_row0 + g, + 8; its queries as packed 16-bit pairs, from 16-byte
// chunk chunk0 of the rows) into the 64 x Q_BLOCK tile at ds_tile, swizzled as the products read it. Each
// register of an A fragment is one thread's share of an 8 x 8 block (row g, columns 2t, 2t + 1): stmatrix writes
// four such blocks per instruction, lane L giving the address of row L % 8 of block L / 8 (blocks: row half
// (L / 8) % 2, 16-byte chunk chunk0 + 2 kk + L / 16).
__device__ __forceinline__ void store_transposed_ds(u32 ds_tile, const u32 (&dst)[WG_Q_TILES / 2][4], int key_row0,
                                                    int chunk0, int lane) {
    const int row = key_row0 + ((lane >> 3) & 1) * 8 + (lane & 7);
    const u32 row_base = ds_tile + row * 128;
    #pragma unroll
    for (int kk = 0; kk < WG_Q_TILES / 2; ++kk) {
        const u32 chunk = (u32)(chunk0 + 2 * kk + (lane >> 4));
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], { %1, %2, %3, %4 };\n"
                     :: "r"(row_base + ((chunk ^ (u32)(row & 7)) << 4)),
                        "r"(dst[kk][0]), "r"(dst[kk][1]), "r"(dst[kk][2]), "r"(dst[kk][3]) : "memory");
    }
}

// A warp's 16 rows x DQ_COLS of dQ into its staging tile at `stage`, in the order of its accumulator fragments
// (column group j, row half, lane, then the pair: the fp32 buffer's tile layout, dq_tile_index), with
// conflict-free 8-byte stores.
__device__ __forceinline__ void stage_dq_tile(const float (&dq)[DQ_COLS / 8][4], u32 stage, int lane) {
    #pragma unroll
    for (int j = 0; j < DQ_COLS / 8; ++j)
        #pragma unroll
        for (int half = 0; half < 2; ++half)
            asm volatile("st.shared.v2.f32 [%0], { %1, %2 };\n"
                         :: "r"(stage + ((j * 2 + half) * 32 + lane) * 8), "f"(dq[j][half * 2]), "f"(dq[j][half * 2 + 1])
                         : "memory");
}

// Keys 64 wg .. 64 wg + 63 may only be overwritten once both warpgroups' dQ products have read the whole dS^T
// tile; and dS^T must be whole before either reads it: a barrier of the 256 consumer threads (id 1; 0 is
// __syncthreads).
__device__ __forceinline__ void sync_warpgroups() {
    asm volatile("bar.sync 1, %0;\n" :: "n"(KV_THREADS) : "memory");
}

// ---- adding a warp's 16 rows x DQ_COLS of dQ to the fp32 buffer ----------------------------------------
// dq: the warp's accumulator fragments (rows g, g + 8; columns 8j + 2t, + 1); the target: the row-major
// buffer at the warp's first row and its warpgroup's first column (red2), or the warp's tile (bulk_tile);
// rows_valid: how many of the 16 rows are < seq_len. The emitter picks one (BackwardSpec.dq_reduction).
// Two floats per reduction, as the fragments hold them.
__device__ __forceinline__ void add_dq(const float (&dq)[DQ_COLS / 8][4], float* dq_row0, int rows_valid, int lane, u32) {
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int half = 0; half < 2; ++half)
        if (g + half * 8 < rows_valid) {
            float* dst = dq_row0 + (g + half * 8) * HEAD_DIM + 2 * t;
            #pragma unroll
            for (int j = 0; j < DQ_COLS / 8; ++j) red_add_f32x2(dst + j * 8, dq[j][half * 2], dq[j][half * 2 + 1]);
        }
}

// after setmaxnreg (FA3's split: maskc.codegen.plan.dkdv_registers)
constexpr int PRODUCER_REGISTERS = 24, CONSUMER_REGISTERS = 240;
static_assert(DKDV_THREADS == KV_THREADS + 128, "the consumers plus a producer warpgroup");
static_assert(128 * PRODUCER_REGISTERS + KV_THREADS * CONSUMER_REGISTERS <= launch_register_pool(DKDV_THREADS),
              "setmaxnreg's split within the registers the CTA holds from launch");
constexpr int COL_BLOCKS   = HEAD_DIM / 64;                  // 64-column boxes per row (128 bytes each)
constexpr int BITS_WORDS   = Q_BLOCK * (KV_BLOCK / 32);      // one step's visibility bits
constexpr int DS_TILE_BYTES = KV_BLOCK * Q_BLOCK * 2;        // one step's dS^T
constexpr int DQ_WG_BYTES  = 64 * DQ_COLS * 4;               // a warpgroup's dQ tile: 4 warps' 16 x DQ_COLS floats
// Named barriers (0 is __syncthreads, 1 the consumers' sync_warpgroups): warpgroup wg's dQ staging tile is
// full (DQ_FULL + wg) or free again (DQ_EMPTY + wg), between its 128 threads and the dQ warp.
constexpr int DQ_FULL = 2, DQ_EMPTY = 4, DQ_HANDOFF_THREADS = 128 + 32;

// The mbarriers: [kv_full][q_full x2][q_empty x2]
__device__ __forceinline__ u32 kv_full_bar(u32 smem0) { return smem0 + KV_SMEM_BARS; }
__device__ __forceinline__ u32 q_full_bar(u32 smem0, int stage) { return smem0 + KV_SMEM_BARS + 8 + 8 * stage; }
__device__ __forceinline__ u32 q_empty_bar(u32 smem0, int stage) { return smem0 + KV_SMEM_BARS + 24 + 8 * stage; }

template <bool WITH_DQ, bool ORDERED = false>
__device__ __forceinline__ void dkdv_kernel(MASKC_DKDV_PARAMS,
    const int* __restrict__ dq_rank_base, const int* __restrict__ dq_ranks, int* __restrict__ dq_turns,
    const TensorMap& q_map, const TensorMap& k_map, const TensorMap& v_map, const TensorMap& do_map) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // the warp index through a shuffle: the compiler then knows it warp-uniform, and keeps the descriptors
    // and addresses derived from it in uniform registers (no conversion before each wgmma)
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const auto [hk, column, mb, b, k0, group] =
        key_block(col_order, num_heads, num_kv_heads, kv_len, mask_batch, section_heads, front_columns);
    const int run_begin = col_offsets[column], run_end = col_offsets[column + 1];

    // tiles start at the 1024-byte swizzle atom (the layout reserves the slack)
    const u32 smem0 = (smem_address(smem_raw) + 1023) & ~1023u;
    unsigned char* smem = smem_raw + (smem0 - smem_address(smem_raw));
    const u32 k_smem = smem0 + KV_SMEM_K, v_smem = smem0 + KV_SMEM_V;
    auto q_tile  = [&](int stage) { return smem0 + KV_SMEM_Q + stage * Q_TILE_BYTES; };
    auto do_tile = [&](int stage) { return smem0 + KV_SMEM_DO + stage * Q_TILE_BYTES; };
    const float* lse_smem = reinterpret_cast<const float*>(smem + KV_SMEM_LSE);       // [stage][Q_BLOCK]
    const float* delta_smem = reinterpret_cast<const float*>(smem + KV_SMEM_DELTA);   // [stage][Q_BLOCK]

    // the chunk nests' root tables, by every thread before the roles part (the barrier below orders them)
    const int* roots = nullptr;
    if (tid == 0) {
        mbar_init(kv_full_bar(smem0), 1);
        for (int s = 0; s < 2; ++s) {
            mbar_init(q_full_bar(smem0, s), 1);
            mbar_init(q_empty_bar(smem0, s), KV_WARPS);     // one arrival per consumer warp
        }
        mbar_init_fence();
    }
    __syncthreads();   // barriers initialized; from here on the roles synchronize only through them

    if (warp >= KV_WARPS) {
        // ================= producer warpgroup =================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(PRODUCER_REGISTERS));
        if (warp == KV_WARPS && lane == 0) {
            // ---- the loads: K and V once, then each step's query side into stage i % 2 ----
            const u32 kv_full = kv_full_bar(smem0);
            mbar_arrive_expect_bytes(kv_full, 2 * KV_BLOCK * HEAD_DIM * 2);
            for (int cb = 0; cb < COL_BLOCKS; ++cb) {
                tma_load_4d(k_smem + cb * KV_BLOCK * 128, k_map, cb * 64, k0, hk, b, kv_full);
                tma_load_4d(v_smem + cb * KV_BLOCK * 128, v_map, cb * 64, k0, hk, b, kv_full);
            }
            const int padded = padded_rows(seq_len);
            int i = 0;
            for (ColumnStep step = first_step(run_begin, run_end, group, col_runs); step.gi < group;
                 step = next_step(step, run_begin, run_end, group, col_runs), ++i) {
                const int stage = i & 1;
                if (i >= 2) mbar_wait(q_empty_bar(smem0, stage), ((i >> 1) & 1) ^ 1);   // step i - 2 is done
                const int h = hk * group + step.gi, q0 = step.qb * Q_BLOCK;
                const u32 full = q_full_bar(smem0, stage);
                mbar_arrive_expect_bytes(full, 2 * Q_TILE_BYTES + 2 * Q_BLOCK * 4);
                for (int cb = 0; cb < COL_BLOCKS; ++cb) {     // rows past seq_len arrive as zeros
                    tma_load_4d(q_tile(stage) + cb * Q_BLOCK * 128, q_map, cb * 64, q0, h, b, full);
                    tma_load_4d(do_tile(stage) + cb * Q_BLOCK * 128, do_map, cb * 64, q0, h, b, full);
                }
                const long long row0 = ((long long)b * num_heads + h) * padded + q0;   // whole in the padding
                bulk_load(smem0 + KV_SMEM_LSE + stage * Q_BLOCK * 4, lse_log2 + row0, Q_BLOCK * 4, full);
                bulk_load(smem0 + KV_SMEM_DELTA + stage * Q_BLOCK * 4, delta + row0, Q_BLOCK * 4, full);
            }
        }
        return;
    }

    // ================= consumer warpgroups =================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(CONSUMER_REGISTERS));
    const int wg = warp >> 2;
    const int key_row0 = (warp & 3) * 16;                         // this warp's key rows in the tile
    const int wg_q0 = wg * (Q_BLOCK / 2);                         // its warpgroup's first query of each step
    const int* mask = mask_data + mask_offsets[mb];
    u32* bits_smem = reinterpret_cast<u32*>(smem + KV_SMEM_BITS);   // [stage][BITS_WORDS]

    float dk_acc[WG_D_TILES][4] = {}, dv_acc[WG_D_TILES][4] = {};   // this warp's 16 rows of dK and dV

    mbar_wait(kv_full_bar(smem0), 0);      // K and V (also before the epilogue stages dK and dV through them)
    int i = 0;
    for (ColumnStep step = first_step(run_begin, run_end, group, col_runs); step.gi < group;
         step = next_step(step, run_begin, run_end, group, col_runs), ++i) {
        const int stage = i & 1;
        const int h = hk * group + step.gi;
        const int q0 = step.qb * Q_BLOCK;
        const u32 q_smem = q_tile(stage), do_smem = do_tile(stage);
        u32* bits = bits_smem;
        mbar_wait(q_full_bar(smem0, stage), (i >> 1) & 1);
        const u32 ds_tile = smem0 + KV_SMEM_DS + stage * DS_TILE_BYTES;
        const u32 pt_tile = smem0 + KV_SMEM_PT + stage * DS_TILE_BYTES;

        // ---- S^T = K Q^T and dP^T = V dO^T, issued together; the visibility bits meanwhile ----
        float p[WG_Q_TILES][4], ds[WG_Q_TILES][4];
        wgmma_fence();
        transposed_scores(p, k_smem, wg, q_smem);
        wgmma_commit();
        transposed_scores(ds, v_smem, wg, do_smem);
        wgmma_commit();
        const bool masked = step.kind == KIND_PARTIAL;
        if (masked) {
            tile_visibility<Q_BLOCK, KV_BLOCK, KV_THREADS>(bits, mask, mb, h, q0, k0, seq_len, kv_len, tid, roots);
            sync_warpgroups();
        }

        // ---- P^T, then dV += P^T dO ----
        wgmma_wait<1>();
        fence_accumulators(p);
        transposed_probabilities(p, lse_smem + stage * Q_BLOCK + wg_q0, bits + wg_q0 * (KV_BLOCK / 32), masked, key_row0, lane, scale_log2);
        u32 pt[WG_Q_TILES / 2][4];
        pack_a_fragments(pt, p);
        store_transposed_ds(pt_tile, pt, key_row0, wg_q0 / 8, lane);   // this warp's share of the step's P^T

        // ---- dS^T = P^T (dP^T - delta), to shared memory; then dV += P^T dO ----
        wgmma_wait<0>();
        fence_accumulators(ds);
        transposed_ds(ds, p, delta_smem + stage * Q_BLOCK + wg_q0, lane);
        u32 dst[WG_Q_TILES / 2][4];
        pack_a_fragments(dst, ds);
        store_transposed_ds(ds_tile, dst, key_row0, wg_q0 / 8, lane);
        fence_proxy_async();
        sync_warpgroups();                                  // P^T and dS^T whole before any product reads them
        fence_accumulators(dv_acc);
        wgmma_fence();
        accumulate_keys(dv_acc, pt_tile, do_smem, wg * DQ_COLS);
        wgmma_commit();

        // ---- dQ += dS K, then dK += dS^T Q (scaled at the end), on this warpgroup's columns ----
        if constexpr (WITH_DQ) {
            float dq[DQ_COLS / 8][4];
            wgmma_fence();
            dq_product(dq, ds_tile, k_smem, wg * DQ_COLS);
            wgmma_commit();
            fence_accumulators(dk_acc);
            accumulate_keys(dk_acc, ds_tile, q_smem, wg * DQ_COLS);
            wgmma_commit();
            wgmma_wait<1>();                                    // dV and dQ are done; dK runs on meanwhile
            fence_accumulators(dq);
            const int row0 = q0 + (warp & 3) * 16;              // this warp's 16 query rows of dQ
            add_dq(dq, dq_accum + (((long long)b * num_heads + h) * seq_len + row0) * HEAD_DIM + wg * DQ_COLS,
                   seq_len - row0, lane, 0);
        } else {
            fence_accumulators(dk_acc);
            wgmma_fence();
            accumulate_keys(dk_acc, ds_tile, q_smem, wg * DQ_COLS);
            wgmma_commit();
        }
        wgmma_wait<0>();
        fence_accumulators(dv_acc);
        fence_accumulators(dk_acc);
        __syncwarp();
        // this warp is done with the stage: __syncwarp orders the other lanes' reads of its LSE and delta before
        // lane 0's (release) arrival. compute-sanitizer's racecheck tracks arrivals per thread and reports the
        // copy engine's next write there; every lane arriving silences it at 0.5-1.7% of the backward (run 65).
        if (lane == 0) mbar_arrive(q_empty_bar(smem0, stage));
    }

    // ---- epilogue: dK (scaled) and dV, staged through this warp's own rows of the K and V tiles ----
    sync_warpgroups();   // every warpgroup's products have read K and V
    const long long out_row0 = ((long long)b * num_kv_heads + hk) * kv_len;
    store_rows_16xD(dk_acc, scale, k_smem, key_row0, dk + out_row0 * HEAD_DIM, k0 + key_row0, kv_len, lane, wg * WG_D_TILES);
    store_rows_16xD(dv_acc, 1.f, v_smem, key_row0, dv + out_row0 * HEAD_DIM, k0 + key_row0, kv_len, lane, wg * WG_D_TILES);
}


}  // namespace maskc

// ---- entries -----------------------------------------------------------------------------------------

// delta = rowsum(dO * O) - dLSE (dLSE may be null) and LSE in log2 units, +inf for a row that sees no key
// (so that its P is 0 everywhere). One warp per row of the [B, Hq, padded_rows(S)] grid; the padding rows get
// LSE = +inf and delta = 0. It also zeroes the dK/dV kernel's fp32 dQ buffer ([B, Hq, padded_rows(S), D]) and
// dQ turn counters ([B, Hq, padded_rows(S) / ROW_PAD]) where they are given (null: not used by this call), in the
// same pass over the rows instead of two fills of their own.
extern "C" __global__ void __launch_bounds__(PREP_WARPS * 32) maskc_bwd_prep_document(
    const unsigned short* __restrict__ o, const unsigned short* __restrict__ dout,
    const float* __restrict__ lse, const float* __restrict__ dlse,
    long long o_sb, long long o_sh, long long o_ss, long long do_sb, long long do_sh, long long do_ss,
    float* __restrict__ lse_log2, float* __restrict__ delta, float* __restrict__ dq_accum,
    int* __restrict__ dq_turns, int num_heads, int seq_len, long long rows) {
    using namespace maskc;
    const long long row = (long long)blockIdx.x * PREP_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int padded = padded_rows(seq_len);
    const int qi = (int)(row % padded);
    const long long bh = row / padded;
    if (dq_accum != nullptr) {
        float4* accum_row = reinterpret_cast<float4*>(dq_accum + row * HEAD_DIM);
        #pragma unroll
        for (int i = lane; i < HEAD_DIM / 4; i += 32) accum_row[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (dq_turns != nullptr && lane == 0 && qi % ROW_PAD == 0) dq_turns[row / ROW_PAD] = 0;
    if (qi >= seq_len) {
        if (lane == 0) { delta[row] = 0.f; lse_log2[row] = pos_inf(); }
        return;
    }
    const long long in_row = bh * seq_len + qi;                 // lse and dlse are [B, Hq, S]
    const int h = (int)(bh % num_heads), b = (int)(bh / num_heads);
    const u32* o_row = reinterpret_cast<const u32*>(o + b * o_sb + h * o_sh + qi * o_ss);
    const u32* do_row = reinterpret_cast<const u32*>(dout + b * do_sb + h * do_sh + qi * do_ss);
    float sum = 0.f;
    #pragma unroll
    for (int i = lane; i < HEAD_DIM / 2; i += 32) {   // two elements per 32-bit word
        const float2 x = unpack2(o_row[i]), y = unpack2(do_row[i]);
        sum = fmaf(x.x, y.x, fmaf(x.y, y.y, sum));
    }
    #pragma unroll
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (lane == 0) {
        const float l = lse[in_row];
        delta[row] = sum - (dlse != nullptr ? dlse[in_row] : 0.f);
        lse_log2[row] = l == neg_inf() ? pos_inf() : l * 1.4426950408889634f;
    }
}

// Grid: x = column work items (len(col_order) * Hkv: the first front_columns column blocks for every kv head,
// then the rest in L2 sections of section_heads kv heads, heaviest first in each), y = batch elements when the mask is broadcast over the batch, else 1. Block:
// DKDV_THREADS. Dynamic smem: KV_SMEM_BYTES. dk, dv: [B, Hkv, Skv, D] contiguous; dq_accum: [B, Hq,
// padded_rows(S), D] fp32 (bulk_tile: in tiles), zeroed by the prep kernel. The warp-specialized engine also takes
// tensor maps of q, k, v and dout (maskc.runtime.tma: boxes of 64 columns x Q_BLOCK or KV_BLOCK rows).
#define MASKC_DKDV_ENTRY_PARAMS                                                                                  \
    MASKC_DKDV_PARAMS, const int* __restrict__ dq_rank_base, const int* __restrict__ dq_ranks,                   \
    int* __restrict__ dq_turns, const __grid_constant__ maskc::TensorMap q_map,                                  \
    const __grid_constant__ maskc::TensorMap k_map, const __grid_constant__ maskc::TensorMap v_map,              \
    const __grid_constant__ maskc::TensorMap do_map
#define MASKC_DKDV_ARGS                                                                                          \
    q, k, v, dout, lse_log2, delta, dk, dv, dq_accum, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,      \
    do_sb, do_sh, do_ss, num_heads, num_kv_heads, seq_len, kv_len, mask_batch, section_heads, front_columns,     \
    col_offsets, col_runs, col_order, mask_data, mask_offsets, scale, scale_log2, dq_rank_base, dq_ranks,   \
    dq_turns, q_map, k_map, v_map, do_map

extern "C" __global__ void __launch_bounds__(DKDV_THREADS, 1) maskc_bwd_dkdv_document(MASKC_DKDV_ENTRY_PARAMS) {
    maskc::dkdv_kernel<true>(MASKC_DKDV_ARGS);
}
extern "C" __global__ void __launch_bounds__(DKDV_THREADS, 1) maskc_bwd_dkdv_det_document(MASKC_DKDV_ENTRY_PARAMS) {
    maskc::dkdv_kernel<false>(MASKC_DKDV_ARGS);
}

// Deterministic dQ. Grid: x = row work items (len(work_order) * Hq, heaviest first), y as above.
// Block: DQ_THREADS. Dynamic smem: DQ_SMEM_BYTES. dq: [B, Hq, S, D] contiguous.
extern "C" __global__ void __launch_bounds__(DQ_THREADS) maskc_bwd_dq_document(
    const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
    const unsigned short* __restrict__ v, const unsigned short* __restrict__ dout,
    const float* __restrict__ lse_log2, const float* __restrict__ delta, unsigned short* __restrict__ dq,
    long long q_sb, long long q_sh, long long q_ss, long long k_sb, long long k_sh, long long k_ss,
    long long v_sb, long long v_sh, long long v_ss, long long do_sb, long long do_sh, long long do_ss,
    int num_heads, int num_kv_heads, int seq_len, int kv_len, int mask_batch, int section_heads,
    const int* __restrict__ run_offsets, const int* __restrict__ runs, const int* __restrict__ work_order,
    const int* __restrict__ mask_data, const int* __restrict__ mask_offsets, float scale, float scale_log2) {
    using namespace maskc;
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const HeadSlot hs = head_and_slot(num_heads, section_heads, 0);
    const int h = hs.head;
    const int r = work_order[hs.slot];                          // row block
    const int q_blocks = (seq_len + Q_BLOCK - 1) / Q_BLOCK;
    const int mb = r / q_blocks;
    const int b = mask_batch == 1 ? (int)blockIdx.y : mb;
    const int q0 = (r % q_blocks) * Q_BLOCK;
    const int hk = h / (num_heads / num_kv_heads);
    const int row0 = warp * 16;                                  // this warp's rows in the tile
    const int* mask = mask_data + mask_offsets[mb];
    constexpr int WORDS = DQ_KV_BLOCK / 32;

    const u32 smem0 = smem_address(smem);
    const u32 q_smem = smem0 + DQ_SMEM_Q, do_smem = smem0 + DQ_SMEM_DO;
    u32* bits = reinterpret_cast<u32*>(smem + DQ_SMEM_BITS);
    const int* roots = nullptr;
    const u16* k_base = k + b * k_sb + hk * k_sh;
    const u16* v_base = v + b * v_sb + hk * v_sh;

    load_tile<Q_BLOCK, DQ_THREADS>(q_smem, q + b * q_sb + h * q_sh, q_ss, q0, seq_len, tid);
    load_tile<Q_BLOCK, DQ_THREADS>(do_smem, dout + b * do_sb + h * do_sh, do_ss, q0, seq_len, tid);
    cp_async_commit();
    int run = run_offsets[r];
    const int run_end = run_offsets[r + 1];
    int kv_block = 0, kv_end = 0, kind = 0;
    if (run < run_end) {
        kv_block = runs[3 * run]; kv_end = runs[3 * run + 1]; kind = runs[3 * run + 2];
        load_tile<DQ_KV_BLOCK, DQ_THREADS>(smem0 + DQ_SMEM_K, k_base, k_ss, kv_block * DQ_KV_BLOCK, kv_len, tid);
        load_tile<DQ_KV_BLOCK, DQ_THREADS>(smem0 + DQ_SMEM_V, v_base, v_ss, kv_block * DQ_KV_BLOCK, kv_len, tid);
        cp_async_commit();
    }
    // LSE and delta of rows g and g + 8 (rows past seq_len: P = 0 through LSE = +inf)
    float lse_r[2], delta_r[2];
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int qrow = q0 + row0 + g + half * 8;
        const long long i = ((long long)b * num_heads + h) * padded_rows(seq_len) + qrow;
        lse_r[half] = qrow < seq_len ? lse_log2[i] : pos_inf();
        delta_r[half] = qrow < seq_len ? delta[i] : 0.f;
    }

    u32 a_off[4], b_off[4];
    lane_offsets(a_off, lane & 15, lane >> 4);
    lane_offsets(b_off, (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    float dq_acc[D_TILES][4];
    #pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt)
        #pragma unroll
        for (int e = 0; e < 4; ++e) dq_acc[dt][e] = 0.f;

    int stage = 0;
    while (run < run_end) {
        int next_run = run, next_block = kv_block + 1, next_end = kv_end, next_kind = kind;
        if (next_block == kv_end && ++next_run < run_end) {
            next_block = runs[3 * next_run]; next_end = runs[3 * next_run + 1]; next_kind = runs[3 * next_run + 2];
        }
        const bool has_next = next_run < run_end;
        cp_async_wait<0>();
        __syncthreads();
        if (has_next) {
            load_tile<DQ_KV_BLOCK, DQ_THREADS>(smem0 + DQ_SMEM_K + (stage ^ 1) * DQ_KV_TILE_BYTES, k_base, k_ss,
                                               next_block * DQ_KV_BLOCK, kv_len, tid);
            load_tile<DQ_KV_BLOCK, DQ_THREADS>(smem0 + DQ_SMEM_V + (stage ^ 1) * DQ_KV_TILE_BYTES, v_base, v_ss,
                                               next_block * DQ_KV_BLOCK, kv_len, tid);
            cp_async_commit();
        }
        const int k0 = kv_block * DQ_KV_BLOCK;
        const bool masked = kind == KIND_PARTIAL;
        if (masked) {
            tile_visibility<Q_BLOCK, DQ_KV_BLOCK, DQ_THREADS>(bits, mask, mb, h, q0, k0, seq_len, kv_len, tid, roots);
            __syncthreads();
        }
        const u32 k_smem = smem0 + DQ_SMEM_K + stage * DQ_KV_TILE_BYTES;
        const u32 v_smem = smem0 + DQ_SMEM_V + stage * DQ_KV_TILE_BYTES;

        // ---- P = exp2(S scale_log2 - LSE_log2), S = Q K^T; hidden pairs 0 ----
        float p[DQ_K_TILES][4];
        scores_16xN<DQ_K_TILES>(p, q_smem, row0, a_off, k_smem, b_off);
        #pragma unroll
        for (int nt = 0; nt < DQ_K_TILES; ++nt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int half = e >> 1, col = nt * 8 + 2 * t + (e & 1);
                float x = exp2_approx(fmaf(p[nt][e], scale_log2, -lse_r[half]));
                if (masked && !((bits[(row0 + g + half * 8) * WORDS + (col >> 5)] >> (col & 31)) & 1u)) x = 0.f;
                p[nt][e] = x;
            }
        // ---- dS = P * (dP - delta), dP = dO V^T ----
        float ds[DQ_K_TILES][4];
        scores_16xN<DQ_K_TILES>(ds, do_smem, row0, a_off, v_smem, b_off);
        #pragma unroll
        for (int nt = 0; nt < DQ_K_TILES; ++nt)
            #pragma unroll
            for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - delta_r[e >> 1]);
        // ---- dQ += dS K (scaled at the end) ----
        accumulate_16xD<DQ_K_TILES>(dq_acc, ds, k_smem, a_off);

        run = next_run; kv_block = next_block; kv_end = next_end; kind = next_kind;
        stage ^= 1;
    }
    // Each warp stages dQ through its own Q rows, but those rows were copied in by every thread: a row block
    // without runs has not met a barrier since, so wait for all the copies before overwriting them.
    cp_async_wait<0>();
    __syncthreads();
    store_rows_16xD(dq_acc, scale, q_smem, row0, dq + ((long long)b * num_heads + h) * seq_len * HEAD_DIM,
                    q0 + row0, seq_len, lane);
}

// dq = dq_accum * scale in the input dtype; n = number of elements (even: HEAD_DIM is).
extern "C" __global__ void maskc_bwd_dq_convert_document(const float* __restrict__ dq_accum,
                                                       unsigned short* __restrict__ dq, float scale, long long n,
                                                       int seq_len) {
    using namespace maskc;
    const long long i = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    (void)seq_len;
    const float2 x = *reinterpret_cast<const float2*>(dq_accum + i);
    *reinterpret_cast<u32*>(dq + i) = pack2(x.x * scale, x.y * scale);
}
