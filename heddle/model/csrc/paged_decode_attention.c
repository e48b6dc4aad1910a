/* Decode attention straight from the paged KV cache, float32, for CPUs.
 *
 * The torch reference path (heddle/model/attention.py) first copies every request's blocks
 * into a dense buffer and then runs two batched matmuls: three passes over the whole KV
 * context per layer. This kernel reads each K and V row once, where it lies in the cache.
 *
 * Layouts (all contiguous):
 *   kv            [2, num_kv_heads, num_blocks, block_size, head_dim]   (0 = K, 1 = V)
 *   q             [batch, num_kv_heads, group, head_dim], already multiplied by the scale
 *   block_tables  [batch, max_blocks] int64
 *   context_lens  [batch] int64: keys at positions 0 .. context_len - 1
 *   out           [batch, num_kv_heads, group, head_dim]
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

/* exp(x) for x <= 0 (x = -inf gives 0). */
static inline float exp_neg(float x) {
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

int heddle_paged_decode_attention_f32(
    const float *kv, const float *q, const int64_t *block_tables, const int64_t *context_lens,
    float *out, int64_t batch, int64_t num_kv_heads, int64_t group, int64_t head_dim,
    int64_t num_blocks, int64_t block_size, int64_t max_blocks, int64_t window,
    int64_t num_threads) {
    if (group > MAX_GROUP || head_dim > MAX_HEAD_DIM || block_size > MAX_BLOCK_SIZE) return 1;
    const int64_t head_stride = num_blocks * block_size * head_dim;
    const int64_t v_offset = num_kv_heads * head_stride;
    const int64_t pairs = batch * num_kv_heads;

#pragma omp parallel for schedule(dynamic, 1) num_threads((int)num_threads)
    for (int64_t pair = 0; pair < pairs; ++pair) {
        const int64_t b = pair / num_kv_heads;
        const int64_t h = pair % num_kv_heads;
        const float *k_head = kv + h * head_stride;
        const float *v_head = kv + v_offset + h * head_stride;
        const float *qs = q + pair * group * head_dim;
        float *o = out + pair * group * head_dim;
        const int64_t context = context_lens[b];
        const int64_t first = (window > 0 && context > window) ? context - window : 0;

        float m[MAX_GROUP], l[MAX_GROUP];
        float acc[MAX_GROUP][MAX_HEAD_DIM];
        float s[MAX_GROUP][MAX_BLOCK_SIZE];
        for (int64_t g = 0; g < group; ++g) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
            memset(acc[g], 0, sizeof(float) * head_dim);
        }
        for (int64_t j = first / block_size; j * block_size < context; ++j) {
            const int64_t block = block_tables[b * max_blocks + j];
            const float *kb = k_head + block * block_size * head_dim;
            const float *vb = v_head + block * block_size * head_dim;
            const int64_t t0 = first > j * block_size ? first - j * block_size : 0;
            const int64_t t1 = context - j * block_size < block_size
                                   ? context - j * block_size : block_size;
            for (int64_t g = 0; g < group; ++g) {
                const float *qg = qs + g * head_dim;
                float block_max = -INFINITY;
                for (int64_t t = t0; t < t1; ++t) {
                    const float *kt = kb + t * head_dim;
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
                    const float *vt = vb + t * head_dim;
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
