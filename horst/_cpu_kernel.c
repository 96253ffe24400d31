/* The CPU fast path of HORST and HAM: one pass over each float32 tensor (see _cpu_kernel.py).
 *
 * The same update as horst/functional.py's adamw_mirror_tensor_ (DESIGN §2.1, §2.2):
 *   m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2
 *   -u = neg_step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
 *      = (neg_step_size * bias_correction2_sqrt) * m / (sqrt(v) + eps * bias_correction2_sqrt),
 *     one division instead of two (the scalars arrive so multiplied: SCALED_STEP, SCALED_EPS)
 *   "ms": theta_half = decay * theta - u;  theta = theta_half * exp(e(theta_half))
 *   "sm": theta_mid = theta * exp(e(theta));  theta = decay * theta_mid - u
 *   e(a) = clamp(sign(a) * (alpha_u * (-u) - alpha_g * g) - lr_beta, low, high)
 * copysignf(1, a) replaces sign(a): the two differ only where a == 0, and there the
 * factor multiplies zero. low/high fold HAM's clip and exp_float's float32 range into one clamp.
 *
 * Compiled with -O3 -fno-math-errno -fno-trapping-math (without them gcc vectorizes neither
 * sqrtf nor the comparisons) and the widest vector ISA torch detects; written so that gcc vectorizes
 * the inner loop.
 */
#include <math.h>
#include <stdint.h>

/* horst.mirror.EXP_POLY: exp(r) ~ 1 + r + c2 r^2 + ... + c5 r^5 on |r| <= ln(2) / 2 */
#define EXP_C2 0.4999923177571429f
#define EXP_C3 0.16667114472984093f
#define EXP_C4 0.041890115202198576f
#define EXP_C5 0.008312524894683274f

enum {
    ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, DECAY, SCALED_STEP, SCALED_EPS, ALPHA_U, ALPHA_G, LR_BETA, LOW, HIGH
};

/* exp(x) for x in [-87, 88], as horst.mirror.exp_float32 computes it (2**k * p(r), k the
 * nearest integer to x / ln 2, r = x - k ln 2 in two parts, p the minimax polynomial), except
 * for how k is rounded: adding 1.5 * 2**23 rounds x / ln 2 to an integer held in the low
 * mantissa bits, which, shifted into the exponent field, make 2**k without a conversion. */
static inline float exp_float(float x) {
    const float round_shift = 12582912.0f; /* 1.5 * 2**23 */
    union { float f; int32_t i; } shifted = { .f = x * 1.4426950408889634f + round_shift };
    const float k = shifted.f - round_shift;
    const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187045e-06f;
    const float poly = 1.0f + r * (1.0f + r * (EXP_C2 + r * (EXP_C3 + r * (EXP_C4 + r * EXP_C5))));
    union { int32_t i; float f; } two_to_k = { .i = (shifted.i << 23) + (127 << 23) };
    return poly * two_to_k.f;
}

/* written so that gcc emits one maxps and one minps (NaN passes through) */
static inline float clamp(float x, float low, float high) {
    x = low > x ? low : x;
    return high < x ? high : x;
}

/* always inlined with a constant mirror_first, so that each loop is specialised */
static inline __attribute__((always_inline)) void update(float *restrict param, const float *restrict grad, float *restrict exp_avg,
                   float *restrict exp_avg_sq, int64_t begin, int64_t end, const float *s,
                   const int mirror_first) {
    const float one_minus_beta1 = s[ONE_MINUS_BETA1], beta2 = s[BETA2];
    const float one_minus_beta2 = s[ONE_MINUS_BETA2], decay = s[DECAY];
    const float scaled_step = s[SCALED_STEP], scaled_eps = s[SCALED_EPS];
    const float alpha_u = s[ALPHA_U], alpha_g = s[ALPHA_G], lr_beta = s[LR_BETA];
    const float low = s[LOW], high = s[HIGH];
    for (int64_t i = begin; i < end; i++) {
        const float g = grad[i];
        const float m = exp_avg[i] + one_minus_beta1 * (g - exp_avg[i]);
        const float v = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g;
        const float neg_update = scaled_step * m / (sqrtf(v) + scaled_eps);
        const float pull = alpha_u * neg_update - alpha_g * g;
        float theta = param[i];
        if (mirror_first) {
            theta *= exp_float(clamp(pull * copysignf(1.0f, theta) - lr_beta, low, high));
            theta = theta * decay + neg_update;
        } else {
            theta = theta * decay + neg_update;
            theta *= exp_float(clamp(pull * copysignf(1.0f, theta) - lr_beta, low, high));
        }
        param[i] = theta;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

/* One step over the n_tensors tensors of one param group. Tensors of at least two blocks are
 * split block-wise over num_threads OpenMP threads; smaller ones run on the calling thread
 * (starting a parallel region costs more than updating a bias). */
void horst_adamw_mirror_f32(int64_t n_tensors, float *const *params, const float *const *grads,
                            float *const *exp_avgs, float *const *exp_avg_sqs,
                            const int64_t *numels, const float *scalars, int mirror_first,
                            int num_threads) {
    const int64_t block = 1 << 15;
    for (int64_t t = 0; t < n_tensors; t++) {
        const int64_t n = numels[t];
        const int64_t n_blocks = (n + block - 1) / block;
        #pragma omp parallel for schedule(static) num_threads(num_threads) if(n_blocks > 1 && num_threads > 1)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t begin = b * block;
            const int64_t end = begin + block < n ? begin + block : n;
            if (mirror_first)
                update(params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], begin, end, scalars, 1);
            else
                update(params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], begin, end, scalars, 0);
        }
    }
}
