/* The small operations of one decoder layer in a decode-only step, each one C call.
 *
 * Between its four matmuls a Llama layer runs ~25 small torch ops at a decode step (two
 * RMSNorms of 4 ops each, the residual adds, RoPE's multiply-roll-multiply-add, the split and
 * view of q/k/v, the K/V store, the query's cast and scale, the attention, its cast back,
 * SiLU and the gate product): at one or a few rows each op costs its dispatch, not its
 * arithmetic. Three calls replace them (heddle/model/fused_decode.py):
 *
 *   heddle_add_rms_norm_*       hidden += delta (the residual, in place), out = RMSNorm(hidden)
 *   heddle_decode_attention_*   RoPE of q and k, K/V stored at their slots, paged decode
 *                               attention (paged_decode_attention.c), out in the model's dtype
 *   heddle_silu_mul_*           out = silu(gate) * up of the fused gate/up projection
 *
 * Rounding follows torch's eager bf16 ops exactly: each op of the eager path computes in
 * float32 and rounds its result to bfloat16 (round to nearest even), so every intermediate the
 * eager path rounds is rounded here at the same place (`rnd`). float32 (`_f32`) rounds nothing.
 * Layouts (all contiguous, row-major):
 *   hidden, delta, out  [rows, dim]; weight [dim]
 *   qkv                 [batch, (num_heads + 2 num_kv_heads) * head_dim]: q heads, k heads, v heads
 *   cos, sin            [max_positions, head_dim] (sin with rotate_half's sign folded in:
 *                       rope(x)[d] = x[d] cos[d] + x[(d + D/2) mod D] sin[d])
 *   kv                  [2, num_kv_heads, num_blocks, block_size, head_dim]
 *   gate_up             [rows, 2 * inter]: gate then up
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

int heddle_paged_decode_attention_f32(const void *kv, const float *q, const int64_t *block_tables,
                                      const int64_t *context_lens, float *out, int64_t batch,
                                      int64_t num_kv_heads, int64_t group, int64_t head_dim,
                                      int64_t num_blocks, int64_t block_size, int64_t max_blocks,
                                      int64_t window, int64_t num_threads);
int heddle_paged_decode_attention_bf16(const void *kv, const float *q,
                                       const int64_t *block_tables, const int64_t *context_lens,
                                       float *out, int64_t batch, int64_t num_kv_heads,
                                       int64_t group, int64_t head_dim, int64_t num_blocks,
                                       int64_t block_size, int64_t max_blocks, int64_t window,
                                       int64_t num_threads);

INLINE float bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* torch's c10::BFloat16 conversion: round to nearest even, NaN kept a (quiet) NaN. */
INLINE uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

INLINE float ld(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

INLINE void st(void *p, int64_t i, float v, int bf16) {
    if (bf16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* The value an eager op of the model's dtype would have stored. */
INLINE float rnd(float v, int bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

/* Eager: hidden = hidden + delta; x = weight * rms_norm(hidden.float()).to(dtype) (bf16), or
 * F.rms_norm(hidden, weight) (float32). `delta` may be NULL (the first layer). */
INLINE void add_rms_norm(void *hidden, const void *delta, const void *weight, void *out,
                         int64_t rows, int64_t dim, float eps, int64_t num_threads, int bf16) {
#pragma omp parallel for num_threads((int)num_threads) if (rows >= 8)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = r * dim;
        float sum_sq = 0.0f;
        for (int64_t i = 0; i < dim; ++i) {
            float x = ld(hidden, base + i, bf16);
            if (delta != NULL) {
                x = rnd(x + ld(delta, base + i, bf16), bf16);
                st(hidden, base + i, x, bf16);
            }
            sum_sq += x * x;
        }
        const float inv = 1.0f / sqrtf(sum_sq / (float)dim + eps);
        for (int64_t i = 0; i < dim; ++i) {
            const float x = ld(hidden, base + i, bf16);
            const float w = ld(weight, i, bf16);
            st(out, base + i, bf16 ? w * rnd(x * inv, 1) : x * inv * w, bf16);
        }
    }
}

/* Eager: F.silu(gate) * up, each op rounded to the dtype. */
INLINE void silu_mul(const void *gate_up, void *out, int64_t rows, int64_t inter,
                     int64_t num_threads, int bf16) {
#pragma omp parallel for num_threads((int)num_threads) if (rows * inter >= 65536)
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < inter; ++i) {
            const float g = ld(gate_up, r * 2 * inter + i, bf16);
            const float u = ld(gate_up, r * 2 * inter + inter + i, bf16);
            const float s = rnd(g / (1.0f + expf(-g)), bf16);
            st(out, r * inter + i, s * u, bf16);
        }
    }
}

/* Eager: qk = rope(qk) (x * cos + roll(x) * sin, each op rounded); store k, v at the slots;
 * q.float() * scale into the kernel; its float32 output cast to the dtype. Returns 1 for a
 * slot outside the cache, 2 for a position outside the tables, else the kernel's status. */
INLINE int decode_attention_layer(
    const void *qkv, const int64_t *positions, const void *cos, const void *sin, void *kv,
    const int64_t *slots, const int64_t *block_tables, const int64_t *context_lens,
    float *q_scratch, float *out_scratch, void *out, int64_t batch, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
    int64_t max_blocks, int64_t max_positions, int64_t window, float scale,
    int64_t num_threads, int bf16) {
    const int64_t num_slots = num_blocks * block_size;
    const int64_t row_width = (num_heads + 2 * num_kv_heads) * head_dim;
    const int64_t half = head_dim / 2;
    const int64_t head_stride = num_slots * head_dim;
    const int64_t v_offset = num_kv_heads * head_stride;
    for (int64_t t = 0; t < batch; ++t) {
        if (slots[t] < 0 || slots[t] >= num_slots) return 1;
        if (positions[t] < 0 || positions[t] >= max_positions) return 2;
    }
    for (int64_t t = 0; t < batch; ++t) {
        const int64_t cs = positions[t] * head_dim;
        const int64_t slot = slots[t];
        for (int64_t h = 0; h < num_heads + num_kv_heads; ++h) {
            const int64_t base = t * row_width + h * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) {
                const float x = ld(qkv, base + d, bf16);
                const float x_rolled = ld(qkv, base + (d < half ? d + half : d - half), bf16);
                const float c = ld(cos, cs + d, bf16), s = ld(sin, cs + d, bf16);
                const float rotated = bf16 ? rnd(rnd(x * c, 1) + rnd(x_rolled * s, 1), 1)
                                           : x * c + x_rolled * s;
                if (h < num_heads)
                    q_scratch[(t * num_heads + h) * head_dim + d] = rotated * scale;
                else
                    st(kv, (h - num_heads) * head_stride + slot * head_dim + d, rotated, bf16);
            }
        }
        const int64_t v_base = t * row_width + (num_heads + num_kv_heads) * head_dim;
        const int64_t element = bf16 ? 2 : 4;
        for (int64_t h = 0; h < num_kv_heads; ++h)
            memcpy((char *)kv + (v_offset + h * head_stride + slot * head_dim) * element,
                   (const char *)qkv + (v_base + h * head_dim) * element,
                   (size_t)(head_dim * element));
    }
    const int64_t group = num_heads / num_kv_heads;
    const int status =
        (bf16 ? heddle_paged_decode_attention_bf16 : heddle_paged_decode_attention_f32)(
            kv, q_scratch, block_tables, context_lens, out_scratch, batch, num_kv_heads, group,
            head_dim, num_blocks, block_size, max_blocks, window, num_threads);
    if (status != 0) return status + 2;
    const int64_t n = batch * num_heads * head_dim;
    for (int64_t i = 0; i < n; ++i) st(out, i, out_scratch[i], bf16);
    return 0;
}

#define NORM_ARGS                                                                              \
    void *hidden, const void *delta, const void *weight, void *out, int64_t rows, int64_t dim, \
        float eps, int64_t num_threads
void heddle_add_rms_norm_f32(NORM_ARGS) {
    add_rms_norm(hidden, delta, weight, out, rows, dim, eps, num_threads, 0);
}
void heddle_add_rms_norm_bf16(NORM_ARGS) {
    add_rms_norm(hidden, delta, weight, out, rows, dim, eps, num_threads, 1);
}

void heddle_silu_mul_f32(const void *gate_up, void *out, int64_t rows, int64_t inter,
                         int64_t num_threads) {
    silu_mul(gate_up, out, rows, inter, num_threads, 0);
}
void heddle_silu_mul_bf16(const void *gate_up, void *out, int64_t rows, int64_t inter,
                          int64_t num_threads) {
    silu_mul(gate_up, out, rows, inter, num_threads, 1);
}

#define ATTN_ARGS                                                                              \
    const void *qkv, const int64_t *positions, const void *cos, const void *sin, void *kv,     \
        const int64_t *slots, const int64_t *block_tables, const int64_t *context_lens,        \
        float *q_scratch, float *out_scratch, void *out, int64_t batch, int64_t num_heads,     \
        int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,        \
        int64_t max_blocks, int64_t max_positions, int64_t window, float scale,                \
        int64_t num_threads
#define ATTN_CALL(BF16)                                                                        \
    decode_attention_layer(qkv, positions, cos, sin, kv, slots, block_tables, context_lens,    \
                           q_scratch, out_scratch, out, batch, num_heads, num_kv_heads,        \
                           head_dim, num_blocks, block_size, max_blocks, max_positions,        \
                           window, scale, num_threads, BF16)
int heddle_decode_attention_f32(ATTN_ARGS) { return ATTN_CALL(0); }
int heddle_decode_attention_bf16(ATTN_ARGS) { return ATTN_CALL(1); }
