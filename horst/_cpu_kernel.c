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
 * sign(a) * x is x with a's sign bit xor-ed in: it differs from sign(a) * x only where a == 0,
 * and there the factor multiplies zero. low/high fold HAM's clip and exp_float's float32 range into one clamp.
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

/* sign(a) * x, as copysign-like bit arithmetic: x with its sign flipped where a is negative */
static inline float times_sign_of(float x, float a) {
    union { float f; uint32_t i; } xb = { .f = x }, ab = { .f = a };
    xb.i ^= ab.i & 0x80000000u;
    return xb.f;
}

/* What the mirror step's exponent holds, fixed per call so that each case compiles to its own
 * loop: HORST pulls by the update (alpha_g = 0), HAM by the gradient (alpha_u = 0); tensors
 * without the mirror step (all three coefficients 0, factor exactly 1) skip it. */
enum { PULL_UPDATE, PULL_GRADIENT, PULL_BOTH, NO_MIRROR };

/* always inlined with constant mirror_first and kind, so that each loop is specialised */
static inline __attribute__((always_inline)) void update(
    float *restrict param, const float *restrict grad, float *restrict exp_avg, float *restrict exp_avg_sq,
    int64_t begin, int64_t end, const float *s, const int mirror_first, const int kind) {
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
        const float pull = kind == PULL_UPDATE ? alpha_u * neg_update
                         : kind == PULL_GRADIENT ? -alpha_g * g
                         : alpha_u * neg_update - alpha_g * g;
        float theta = param[i];
        if (kind != NO_MIRROR && mirror_first)
            theta *= exp_float(clamp(times_sign_of(pull, theta) - lr_beta, low, high));
        theta = theta * decay + neg_update;
        if (kind != NO_MIRROR && !mirror_first)
            theta *= exp_float(clamp(times_sign_of(pull, theta) - lr_beta, low, high));
        param[i] = theta;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

/* One step over the n_tensors tensors of one param group, in blocks of `block` elements shared
 * out over num_threads OpenMP threads in one parallel region (one region per tensor costs a
 * thread wake-up per tensor, about 2 % of a GPT-2 step). block_starts[t] is the index of
 * tensor t's first block, block_starts[n_tensors] the total. */
void horst_adamw_mirror_f32(int64_t n_tensors, float *const *params, const float *const *grads,
                            float *const *exp_avgs, float *const *exp_avg_sqs,
                            const int64_t *numels, int64_t block, const int64_t *block_starts,
                            const float *scalars, int mirror_first, int num_threads) {
    const int64_t n_blocks = block_starts[n_tensors];
    const int kind = scalars[ALPHA_U] == 0 && scalars[ALPHA_G] == 0 && scalars[LR_BETA] == 0 ? NO_MIRROR
                   : scalars[ALPHA_G] == 0 ? PULL_UPDATE
                   : scalars[ALPHA_U] == 0 ? PULL_GRADIENT
                   : PULL_BOTH;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if(n_blocks > 1 && num_threads > 1)
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t t = 0, last = n_tensors - 1; /* the tensor holding block b: binary search */
        while (t < last) {
            const int64_t mid = (t + last + 1) / 2;
            if (block_starts[mid] <= b) t = mid; else last = mid - 1;
        }
        const int64_t begin = (b - block_starts[t]) * block;
        const int64_t end = begin + block < numels[t] ? begin + block : numels[t];
        float *p = params[t], *m = exp_avgs[t], *v = exp_avg_sqs[t];
        const float *g = grads[t];
        switch (2 * kind + mirror_first) {
        case 2 * PULL_UPDATE: update(p, g, m, v, begin, end, scalars, 0, PULL_UPDATE); break;
        case 2 * PULL_UPDATE + 1: update(p, g, m, v, begin, end, scalars, 1, PULL_UPDATE); break;
        case 2 * PULL_GRADIENT: update(p, g, m, v, begin, end, scalars, 0, PULL_GRADIENT); break;
        case 2 * PULL_GRADIENT + 1: update(p, g, m, v, begin, end, scalars, 1, PULL_GRADIENT); break;
        case 2 * PULL_BOTH: update(p, g, m, v, begin, end, scalars, 0, PULL_BOTH); break;
        case 2 * PULL_BOTH + 1: update(p, g, m, v, begin, end, scalars, 1, PULL_BOTH); break;
        default: update(p, g, m, v, begin, end, scalars, 0, NO_MIRROR); break;
        }
    }
}
