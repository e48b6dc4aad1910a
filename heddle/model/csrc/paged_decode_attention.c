/* Decode attention straight from the paged KV cache, for CPUs; and the K/V store.
 *
 * The torch reference path (heddle/model/attention.py) first copies every request's blocks
 * into a dense buffer and then runs two batched matmuls: three passes over the whole KV
 * context per layer. This kernel reads each K and V row once, where it lies in the cache.
 *
 * Two element types of the cache: float32 (`_f32`) and bfloat16 (`_bf16`, widened to float32
 * exactly, as the top 16 bits of a float). q, out and every sum are float32 in both.
 *
 * Layouts (all contiguous):
 *   kv            [2, num_kv_heads, num_blocks, block_size, head_dim]   (0 = K, 1 = V)
 *   q             [batch, num_kv_heads, group, head_dim] float32, already multiplied by the scale
 *   block_tables  [batch, max_blocks] int64
 *   context_lens  [batch] int64: keys at positions 0 .. context_len - 1
 *   out           [batch, num_kv_heads, group, head_dim] float32
 * A sliding window > 0 keeps only the last `window` keys.
 *
 * Online softmax per block of keys; exp is a polynomial (|rel err| < 2e-7 on x <= 0) that
 * the compiler vectorizes. Built at run time by heddle/model/kernels.py; OpenMP threads are
 * torch's own (same libgomp soname), so the two do not fight over the cores.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
#define MAX_BLOCK_SIZE 128
#define INLINE static inline __attribute__((always_inline))

/* bfloat16 -> float32 of n values (exact: a bf16 is the top half of a float). memcpy is the
 * defined way to reinterpret the bits; the compiler turns the loop into vector shifts. */
INLINE void widen_bf16(const uint16_t *src, int64_t n, float *dst) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(dst + i, &bits, sizeof(float));
    }
}

/* Rows [t0, t1) of one block of K or V as float32: the cache itself (float32) or `scratch`
 * holding the widened rows (bfloat16). Row t of the result is at [t * head_dim]. */
INLINE const float *block_rows(const void *kv, int64_t offset, int64_t t0, int64_t t1,
                               int64_t head_dim, int bf16, float *scratch) {
    if (!bf16) return (const float *)kv + offset;
    widen_bf16((const uint16_t *)kv + offset + t0 * head_dim, (t1 - t0) * head_dim,
               scratch + t0 * head_dim);
    return scratch;
}

/* exp(x) for x <= 0 (x = -inf gives 0). */
INLINE float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float log2e = 1.44269504088896341f;
    float n = __builtin_floorf(x * log2e + 0.5f);
    float r = x - n * 0.693145751953125f;   /* Cody-Waite: ln2 = hi + lo */
    r = r - n * 1.428606765330187045e-06f;
    /* e^r on [-ln2/2, ln2/2], degree-6 Taylor/minimax coefficients */
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* The kernel, specialized by the constant `bf16` in the two entry points below. */
INLINE int decode_attention(
    const void *kv, const float *q, const int64_t *block_tables, const int64_t *context_lens,
    float *out, int64_t batch, int64_t num_kv_heads, int64_t group, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, int64_t window,
    int64_t num_threads, int bf16) {
    if (group > MAX_GROUP || head_dim > MAX_HEAD_DIM || block_size > MAX_BLOCK_SIZE) return 1;
    /* Offsets in elements of the cache. */
    const int64_t head_stride = num_blocks * block_size * head_dim;
    const int64_t v_offset = num_kv_heads * head_stride;
    const int64_t pairs = batch * num_kv_heads;

#pragma omp parallel for schedule(dynamic, 1) num_threads((int)num_threads)
    for (int64_t pair = 0; pair < pairs; ++pair) {
        const int64_t b = pair / num_kv_heads;
        const int64_t h = pair % num_kv_heads;
        const float *qs = q + pair * group * head_dim;
        float *o = out + pair * group * head_dim;
        const int64_t context = context_lens[b];
        const int64_t first = (window > 0 && context > window) ? context - window : 0;

        float m[MAX_GROUP], l[MAX_GROUP];
        float acc[MAX_GROUP][MAX_HEAD_DIM];
        float s[MAX_GROUP][MAX_BLOCK_SIZE];
        float k_scratch[bf16 ? MAX_BLOCK_SIZE * MAX_HEAD_DIM : 1];
        float v_scratch[bf16 ? MAX_BLOCK_SIZE * MAX_HEAD_DIM : 1];
        for (int64_t g = 0; g < group; ++g) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
            memset(acc[g], 0, sizeof(float) * head_dim);
        }
        for (int64_t j = first / block_size; j * block_size < context; ++j) {
            const int64_t block = block_tables[b * max_blocks + j];
            const int64_t kb = h * head_stride + block * block_size * head_dim;
            const int64_t vb = v_offset + kb;
            const int64_t t0 = first > j * block_size ? first - j * block_size : 0;
            const int64_t t1 = context - j * block_size < block_size
                                   ? context - j * block_size : block_size;
            const float *kf = block_rows(kv, kb, t0, t1, head_dim, bf16, k_scratch);
            const float *vf = block_rows(kv, vb, t0, t1, head_dim, bf16, v_scratch);
            for (int64_t g = 0; g < group; ++g) {
                const float *qg = qs + g * head_dim;
                float block_max = -INFINITY;
                for (int64_t t = t0; t < t1; ++t) {
                    const float *kt = kf + t * head_dim;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * kt[d];
                    s[g][t] = dot;
                    block_max = dot > block_max ? dot : block_max;
                }
                const float new_m = block_max > m[g] ? block_max : m[g];
                const float rescale = exp_neg(m[g] - new_m);
                l[g] *= rescale;
                float *a = acc[g];
#pragma omp simd
                for (int64_t d = 0; d < head_dim; ++d) a[d] *= rescale;
                float total = 0.0f;
#pragma omp simd reduction(+ : total)
                for (int64_t t = t0; t < t1; ++t) {
                    s[g][t] = exp_neg(s[g][t] - new_m);
                    total += s[g][t];
                }
                l[g] += total;
                for (int64_t t = t0; t < t1; ++t) {
                    const float p = s[g][t];
                    const float *vt = vf + t * head_dim;
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; ++d) a[d] += p * vt[d];
                }
                m[g] = new_m;
            }
        }
        for (int64_t g = 0; g < group; ++g) {
            const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
            for (int64_t d = 0; d < head_dim; ++d) o[g * head_dim + d] = acc[g][d] * inv;
        }
    }
    return 0;
}

#define DECODE_ARGS                                                                            \
    const void *kv, const float *q, const int64_t *block_tables, const int64_t *context_lens,  \
    float *out, int64_t batch, int64_t num_kv_heads, int64_t group, int64_t head_dim,          \
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, int64_t window,                \
    int64_t num_threads
#define DECODE_CALL(BF16)                                                                      \
    decode_attention(kv, q, block_tables, context_lens, out, batch, num_kv_heads, group,       \
                     head_dim, num_blocks, block_size, max_blocks, window, num_threads, BF16)

int heddle_paged_decode_attention_f32(DECODE_ARGS) { return DECODE_CALL(0); }
int heddle_paged_decode_attention_bf16(DECODE_ARGS) { return DECODE_CALL(1); }

/* Store the step's new K/V rows at their slots: k, v [num_tokens, num_kv_heads, head_dim]
 * (contiguous), slot s of head h at kv[kind, h, s // block_size, s % block_size]. Any element
 * type: row_bytes = head_dim * element size. The torch path (index_copy_ of a stacked,
 * transposed copy) measured several times slower on decode-sized steps. */
int heddle_store_kv(char *kv, const char *k, const char *v, const int64_t *slots,
                    int64_t num_tokens, int64_t num_kv_heads, int64_t num_slots,
                    int64_t row_bytes) {
    const int64_t head_stride = num_slots * row_bytes;
    const int64_t v_offset = num_kv_heads * head_stride;
    for (int64_t t = 0; t < num_tokens; ++t)
        if (slots[t] < 0 || slots[t] >= num_slots) return 1;
    for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            const int64_t src = (t * num_kv_heads + h) * row_bytes;
            const int64_t dst = h * head_stride + slots[t] * row_bytes;
            memcpy(kv + dst, k + src, (size_t)row_bytes);
            memcpy(kv + v_offset + dst, v + src, (size_t)row_bytes);
        }
    }
    return 0;
}
