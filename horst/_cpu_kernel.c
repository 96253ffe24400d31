/* The CPU fast path of every horst optimizer: one pass over each float32 tensor (see _cpu_kernel.py).
 *
 * The same update as horst/functional.py's mirror_step_ with the bases' descend functions
 * (docs/design.md §2.1-§2.3), per element:
 *   g = grad_scale * grad;  "sm": g *= 1 + alpha_u |theta|
 *   anchor = decay * theta  ("sm": decay * exp(-lr_beta) * theta)
 *   ADAMW:  m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2
 *           -u = neg_step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
 *              = (neg_step_size * bias_correction2_sqrt) * m / (sqrt(v) + eps * bias_correction2_sqrt),
 *           one division instead of two
 *   LION:   -u = neg_step_size * sign(beta1 m + (1 - beta1) g);  m = lerp(m, g, 1 - beta2)
 *   SGD:    d = g + coupled_decay theta;  b = buffer_decay b + one_minus_dampening d (with momentum);
 *           -u = neg_step_size * (d, b, or d + momentum b for Nesterov)
 *   theta_half = anchor - u
 *   "ms": theta = theta_half * exp(clamp(sign(theta_half) * (alpha_u (-u) - alpha_g g) - lr_beta, low, high))
 *         (Lion: -u is +-lr or 0, so the factor is one of three computed once per call)
 *   guard (HAM): theta = isfinite(theta) ? theta : old theta
 * sign(a) * x is x with a's sign bit xor-ed in: it differs from sign(a) * x only where a == 0,
 * and there the factor multiplies zero. low/high fold HAM's clip and exp_float's float32 range
 * into one clamp.
 *
 * Compiled with -O3 -fno-math-errno -fno-trapping-math (without them gcc vectorizes neither
 * sqrtf nor the comparisons) and the widest vector ISA torch detects; written so that gcc
 * vectorizes the inner loop, one loop per (base, mode) pair.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* horst.mirror.EXP_POLY: exp(r) ~ 1 + r + c2 r^2 + ... + c5 r^5 on |r| <= ln(2) / 2 */
#define EXP_C2 0.4999923177571429f
#define EXP_C3 0.16667114472984093f
#define EXP_C4 0.041890115202198576f
#define EXP_C5 0.008312524894683274f
/* horst.mirror.EXP_ARG_MIN, EXP_ARG_MAX: exp_float's argument range */
#define EXP_ARG_MIN -87.0f
#define EXP_ARG_MAX 88.0f

/* horst.functional.SCALARS, the same names in the same order (a test compares them) */
enum {
    GRAD_SCALE, BETA1, ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, MOMENTUM, BUFFER_DECAY, ONE_MINUS_DAMPENING,
    COUPLED_DECAY, DECAY, NEG_STEP_SIZE, BIAS_CORRECTION2_SQRT, EPS, ALPHA_U, ALPHA_G, LR_BETA, CLIP, N_SCALARS
};

/* the steepest-descent step (horst._cpu_kernel.BASE_*) */
enum { ADAMW, LION, SGD, SGD_MOMENTUM, SGD_NESTEROV, N_BASES };
/* the mirror step (horst._cpu_kernel.MODE_*): none; after the step, pulled by the update
 * (HORST); before it, on the gradient (S∘M); after it, pulled by the gradient (HAM), with
 * HAM's NaN guard or without */
enum { NO_MIRROR, MS_UPDATE, SM, MS_GRADIENT, MS_GRADIENT_GUARDED, N_MODES };

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

static inline float sign_of(float x) { return (float)(x > 0.0f) - (float)(x < 0.0f); }

/* the scalars of one call, with the derived ones computed once */
typedef struct {
    float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, momentum, buffer_decay;
    float one_minus_dampening, coupled_decay, decay, neg_step_size, alpha_u, alpha_g, lr_beta;
    float scaled_step, scaled_eps, low, high, sm_decay;
    float lion_up, lion_down, lion_still; /* Lion's three mirror factors, see update() */
} Scalars;

/* always inlined with constant base, mode and sum_squares, so that each loop is specialised;
 * with sum_squares, returns the sum of the squares of the new weights (HAM's norm cap) from the
 * same pass: in float over SUM_CHUNK elements (a simd reduction: each vector lane adds ~100
 * values, 1e-7 relative error), the chunks in double */
#define SUM_CHUNK 1024
static inline __attribute__((always_inline)) double update(
    float *restrict param, const float *restrict grad, float *restrict state1, float *restrict state2,
    int64_t begin, int64_t end, const Scalars *k, const int base, const int mode, const int sum_squares) {
    const Scalars s = *k;
    double sum_of_squares = 0.0;
    for (int64_t chunk = begin; chunk < end; chunk += SUM_CHUNK) {
    const int64_t chunk_end = chunk + SUM_CHUNK < end ? chunk + SUM_CHUNK : end;
    float chunk_sum = 0.0f;
    #pragma omp simd reduction(+:chunk_sum)
    for (int64_t i = chunk; i < chunk_end; i++) {
        const float theta = param[i];
        float g = s.grad_scale * grad[i];
        if (mode == SM) g *= 1.0f + s.alpha_u * fabsf(theta);
        const float anchor = theta * (mode == SM ? s.sm_decay : s.decay);
        float neg_update;
        if (base == ADAMW) {
            const float m = state1[i] + s.one_minus_beta1 * (g - state1[i]);
            const float v = state2[i] * s.beta2 + s.one_minus_beta2 * g * g;
            neg_update = s.scaled_step * m / (sqrtf(v) + s.scaled_eps);
            state1[i] = m;
            state2[i] = v;
        } else if (base == LION) {
            neg_update = s.neg_step_size * sign_of(state1[i] * s.beta1 + g * s.one_minus_beta1);
            state1[i] = state1[i] + s.one_minus_beta2 * (g - state1[i]);
        } else {
            float d = g + s.coupled_decay * theta;
            if (base != SGD) {
                const float b = state1[i] * s.buffer_decay + s.one_minus_dampening * d;
                state1[i] = b;
                d = base == SGD_NESTEROV ? d + s.momentum * b : b;
            }
            neg_update = s.neg_step_size * d;
        }
        const float half = anchor + neg_update;
        float result = half;
        if (mode == MS_UPDATE && base == LION) {
            /* Lion's -u is +-lr or 0, so the exponent takes three values: no exp per element */
            const float pull = times_sign_of(s.alpha_u * neg_update, half);
            result = half * (pull > 0.0f ? s.lion_up : pull < 0.0f ? s.lion_down : s.lion_still);
        } else if (mode == MS_UPDATE)
            result = half * exp_float(clamp(times_sign_of(s.alpha_u * neg_update, half) - s.lr_beta, s.low, s.high));
        if (mode == MS_GRADIENT || mode == MS_GRADIENT_GUARDED)
            result = half * exp_float(clamp(times_sign_of(-s.alpha_g * g, half) - s.lr_beta, s.low, s.high));
        if (mode == MS_GRADIENT_GUARDED)
            result = fabsf(result) <= 3.402823466e38f ? result : theta; /* false for NaN and inf */
        param[i] = result;
        if (sum_squares) chunk_sum += result * result;
    }
    sum_of_squares += chunk_sum;
    }
    return sum_of_squares;
}

#define CASE(B, M) \
    case (B) * N_MODES + (M): \
        sum_of_squares = sums ? update(p, g, s1, s2, begin, end, &k, B, M, 1) : update(p, g, s1, s2, begin, end, &k, B, M, 0); \
        break;
#define CASES(B) CASE(B, NO_MIRROR) CASE(B, MS_UPDATE) CASE(B, SM) CASE(B, MS_GRADIENT) CASE(B, MS_GRADIENT_GUARDED)

/* One step over the n_tensors tensors of one batch (same scalars), in blocks of `block`
 * elements shared out over num_threads OpenMP threads in one parallel region (one region per
 * tensor costs a thread wake-up per tensor, about 2 % of a GPT-2 step). block_starts[t] is the
 * index of tensor t's first block, block_starts[n_tensors] the total. states1/states2 hold the
 * base's state tensors (NULL where it has fewer). block_sums_of_squares (NULL if not wanted)
 * receives each block's sum of the squares of its new weights. Returns 0, or -1 for an unknown
 * base or mode. */
int horst_mirror_step_f32(int64_t n_tensors, float *const *params, const float *const *grads,
                          float *const *states1, float *const *states2, const int64_t *numels, int64_t block,
                          const int64_t *block_starts, const float *scalars, int base, int mode,
                          int num_threads, double *block_sums_of_squares) {
    if (base < 0 || base >= N_BASES || mode < 0 || mode >= N_MODES) return -1;
    const float *x = scalars;
    const float clip = x[CLIP];
    Scalars k = {
        x[GRAD_SCALE], x[BETA1], x[ONE_MINUS_BETA1], x[BETA2], x[ONE_MINUS_BETA2], x[MOMENTUM], x[BUFFER_DECAY],
        x[ONE_MINUS_DAMPENING], x[COUPLED_DECAY], x[DECAY], x[NEG_STEP_SIZE], x[ALPHA_U], x[ALPHA_G], x[LR_BETA],
        x[NEG_STEP_SIZE] * x[BIAS_CORRECTION2_SQRT], x[EPS] * x[BIAS_CORRECTION2_SQRT],
        -clip > EXP_ARG_MIN ? -clip : EXP_ARG_MIN, clip < EXP_ARG_MAX ? clip : EXP_ARG_MAX, x[DECAY] * expf(-x[LR_BETA]),
        0.0f, 0.0f, 0.0f,
    };
    const float lion_pull = fabsf(x[ALPHA_U] * x[NEG_STEP_SIZE]);
    k.lion_up = exp_float(clamp(lion_pull - x[LR_BETA], k.low, k.high));
    k.lion_down = exp_float(clamp(-lion_pull - x[LR_BETA], k.low, k.high));
    k.lion_still = exp_float(clamp(-x[LR_BETA], k.low, k.high));
    const int64_t n_blocks = block_starts[n_tensors];
    const int sums = block_sums_of_squares != NULL;
    #pragma omp parallel for schedule(static) num_threads(num_threads) if(n_blocks > 1 && num_threads > 1)
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t t = 0, last = n_tensors - 1; /* the tensor holding block b: binary search */
        while (t < last) {
            const int64_t mid = (t + last + 1) / 2;
            if (block_starts[mid] <= b) t = mid; else last = mid - 1;
        }
        const int64_t begin = (b - block_starts[t]) * block;
        const int64_t end = begin + block < numels[t] ? begin + block : numels[t];
        float *p = params[t], *s1 = states1[t], *s2 = states2[t];
        const float *g = grads[t];
        double sum_of_squares = 0.0;
        switch (base * N_MODES + mode) {
            CASES(ADAMW) CASES(LION) CASES(SGD) CASES(SGD_MOMENTUM) CASES(SGD_NESTEROV)
        }
        if (block_sums_of_squares) block_sums_of_squares[b] = sum_of_squares;
    }
    return 0;
}
