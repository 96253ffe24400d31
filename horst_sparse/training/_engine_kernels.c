/* Attention over short sequences, forward and backward, float32: softmax(q k^T * scale) v for every
 * (example, head) of a qkv projection laid out as [batch, seq, 3, heads, head_dim] (timm's), the
 * output as [batch, seq, heads, head_dim] (what the output projection reads).
 *
 * Every number is a fixed sequence of IEEE operations: the sums run in index order, products
 * are accumulated by explicit fmaf (one rounding, whether or not the CPU has FMA; the build
 * passes -ffp-contract=off so the compiler fuses nothing else), and exp is the polynomial below,
 * not libm's (whose variant depends on the CPU). So the bits depend on neither the CPU nor the
 * thread count (each (example, head) is one thread's work). Built by
 * horst_sparse/training/attention.py. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* exp(x) for x <= 0 (a softmax's shifted scores): 2^n * e^r with n = round(x / ln 2), r = x - n ln 2
 * in two parts (Cody-Waite), e^r by Cephes' degree-7 polynomial (~1 ulp); 0 below exp's
 * float range (no denormals). */
static inline float exp_nonpositive(float x) {
    const float clamped = x < -87.0f ? -87.0f : x; /* keeps 2^n a normal number; branch-free, so loops vectorise */
    const float n = floorf(clamped * 1.44269504088896341f + 0.5f);
    float r = fmaf(n, -0.693359375f, clamped);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float y = fmaf(p, r * r, r) + 1.0f;
    union { int32_t bits; float value; } two_n = {((int32_t)n + 127) << 23};
    return x < -87.0f ? 0.0f : y * two_n.value;
}

/* Limits of the shapes (attention.py's MAX_SEQ, MAX_DIM: the caller checks them). */
#define MAX_SEQ 32
#define MAX_DIM 64
#define INLINE static inline __attribute__((always_inline))

/* One (example, head), its sums in the caller's scratch arrays (sized by the caller: constant for
 * the specialised shape, so that the compiler keeps them in registers). The loops run over
 * independent sums innermost (several rows, or a row's lanes), so that the CPU overlaps them;
 * each single sum still runs in index order. */
INLINE void forward_one(const float *q, const float *k, const float *v, float *o, float *p, int64_t seq, int64_t dim,
                        int64_t token, int64_t width, float scale, float *s, float *out) {
    for (int64_t n = 0; n < seq * seq; ++n) s[n] = 0.0f;
    for (int64_t n = 0; n < seq * dim; ++n) out[n] = 0.0f;
    for (int64_t d = 0; d < dim; ++d)
        for (int64_t i = 0; i < seq; ++i)
            for (int64_t j = 0; j < seq; ++j) s[i * seq + j] = fmaf(q[i * token + d], k[j * token + d], s[i * seq + j]);
    for (int64_t i = 0; i < seq; ++i) {
        float *row = s + i * seq, top = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < seq; ++j) {
            row[j] *= scale;
            top = row[j] > top ? row[j] : top;
        }
        for (int64_t j = 0; j < seq; ++j) {
            row[j] = exp_nonpositive(row[j] - top);
            sum += row[j];
        }
        const float inverse = 1.0f / sum;
        for (int64_t j = 0; j < seq; ++j) p[i * seq + j] = row[j] *= inverse;
    }
    for (int64_t j = 0; j < seq; ++j)
        for (int64_t i = 0; i < seq; ++i)
            for (int64_t d = 0; d < dim; ++d) out[i * dim + d] = fmaf(s[i * seq + j], v[j * token + d], out[i * dim + d]);
    for (int64_t i = 0; i < seq; ++i)
        for (int64_t d = 0; d < dim; ++d) o[i * width + d] = out[i * dim + d];
}

INLINE void backward_one(const float *q, const float *k, const float *v, const float *p, const float *go, float *gq,
                         float *gk, float *gv, int64_t seq, int64_t dim, int64_t token, int64_t width, float scale,
                         float *ds, float *weighted, float *dq, float *dk, float *dv) {
    for (int64_t n = 0; n < seq * seq; ++n) ds[n] = 0.0f;
    for (int64_t n = 0; n < seq; ++n) weighted[n] = 0.0f;
    for (int64_t n = 0; n < seq * dim; ++n) dq[n] = dk[n] = dv[n] = 0.0f;
    for (int64_t d = 0; d < dim; ++d) /* d out_i / d prob_ij */
        for (int64_t i = 0; i < seq; ++i)
            for (int64_t j = 0; j < seq; ++j)
                ds[i * seq + j] = fmaf(go[i * width + d], v[j * token + d], ds[i * seq + j]);
    for (int64_t j = 0; j < seq; ++j)
        for (int64_t i = 0; i < seq; ++i) weighted[i] = fmaf(p[i * seq + j], ds[i * seq + j], weighted[i]);
    for (int64_t i = 0; i < seq; ++i)
        for (int64_t j = 0; j < seq; ++j) ds[i * seq + j] = p[i * seq + j] * (ds[i * seq + j] - weighted[i]) * scale;
    for (int64_t j = 0; j < seq; ++j)
        for (int64_t i = 0; i < seq; ++i)
            for (int64_t d = 0; d < dim; ++d) dq[i * dim + d] = fmaf(ds[i * seq + j], k[j * token + d], dq[i * dim + d]);
    for (int64_t i = 0; i < seq; ++i)
        for (int64_t j = 0; j < seq; ++j)
            for (int64_t d = 0; d < dim; ++d) {
                dk[j * dim + d] = fmaf(ds[i * seq + j], q[i * token + d], dk[j * dim + d]);
                dv[j * dim + d] = fmaf(p[i * seq + j], go[i * width + d], dv[j * dim + d]);
            }
    for (int64_t i = 0; i < seq; ++i)
        for (int64_t d = 0; d < dim; ++d) {
            gq[i * token + d] = dq[i * dim + d];
            gk[i * token + d] = dk[i * dim + d];
            gv[i * token + d] = dv[i * dim + d];
        }
}

/* The ViT's shape (6 tokens, head dim 8: a row of q, k, v is one AVX register) in AVX2: the same
 * operations in the same order as the loops above (lanes are the independent sums), so the same
 * bits; only faster. */
#define SEQ6 6
#define DIM8 8

static inline __m256 exp_nonpositive8(__m256 x) {
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                                   _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 scaled = _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
    return _mm256_blendv_ps(scaled, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
}

/* rows[j][d] (j < 6) -> cols[d] with lane j = rows[j][d] (lanes 6, 7 zero) */
static inline void transpose6x8(const float *rows, int64_t stride, __m256 cols[DIM8]) {
    float t[DIM8][DIM8] __attribute__((aligned(32))) = {{0}};
    for (int j = 0; j < SEQ6; ++j)
        for (int d = 0; d < DIM8; ++d) t[d][j] = rows[j * stride + d];
    for (int d = 0; d < DIM8; ++d) cols[d] = _mm256_load_ps(t[d]);
}

/* scores[i] (lane j) = sum over d, in order, of a[i][d] * bt[d] (lane j): 6 rows at once */
static inline void rows_times6(const float *a, int64_t stride, const __m256 bt[DIM8], __m256 scores[SEQ6]) {
    for (int i = 0; i < SEQ6; ++i) scores[i] = _mm256_setzero_ps();
    for (int d = 0; d < DIM8; ++d)
        for (int i = 0; i < SEQ6; ++i)
            scores[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i * stride + d), bt[d], scores[i]);
}

static void forward_6x8(const float *q, const float *k, const float *v, float *o, float *p, int64_t token,
                        int64_t width, float scale) {
    __m256 kt[DIM8], s[SEQ6], out[SEQ6];
    float row[SEQ6][DIM8] __attribute__((aligned(32)));
    transpose6x8(k, token, kt);
    rows_times6(q, token, kt, s);
    for (int i = 0; i < SEQ6; ++i) {
        _mm256_store_ps(row[i], _mm256_mul_ps(s[i], _mm256_set1_ps(scale)));
        float top = -INFINITY, sum = 0.0f;
        for (int j = 0; j < SEQ6; ++j) top = row[i][j] > top ? row[i][j] : top;
        _mm256_store_ps(row[i], exp_nonpositive8(_mm256_sub_ps(_mm256_load_ps(row[i]), _mm256_set1_ps(top))));
        for (int j = 0; j < SEQ6; ++j) sum += row[i][j];
        _mm256_store_ps(row[i], _mm256_mul_ps(_mm256_load_ps(row[i]), _mm256_set1_ps(1.0f / sum)));
        for (int j = 0; j < SEQ6; ++j) p[i * SEQ6 + j] = row[i][j];
        out[i] = _mm256_setzero_ps();
    }
    for (int j = 0; j < SEQ6; ++j) {
        const __m256 vj = _mm256_loadu_ps(v + j * token);
        for (int i = 0; i < SEQ6; ++i) out[i] = _mm256_fmadd_ps(_mm256_set1_ps(row[i][j]), vj, out[i]);
    }
    for (int i = 0; i < SEQ6; ++i) _mm256_storeu_ps(o + i * width, out[i]);
}

static void backward_6x8(const float *q, const float *k, const float *v, const float *p, const float *go, float *gq,
                         float *gk, float *gv, int64_t token, int64_t width, float scale) {
    __m256 vt[DIM8], dp[SEQ6], dq[SEQ6], dk[SEQ6], dv[SEQ6];
    float ds[SEQ6][DIM8] __attribute__((aligned(32)));
    transpose6x8(v, token, vt);
    rows_times6(go, width, vt, dp);
    for (int i = 0; i < SEQ6; ++i) {
        _mm256_store_ps(ds[i], dp[i]);
        float weighted = 0.0f;
        for (int j = 0; j < SEQ6; ++j) weighted = fmaf(p[i * SEQ6 + j], ds[i][j], weighted);
        for (int j = 0; j < SEQ6; ++j) ds[i][j] = p[i * SEQ6 + j] * (ds[i][j] - weighted) * scale;
        dq[i] = dk[i] = dv[i] = _mm256_setzero_ps();
    }
    for (int j = 0; j < SEQ6; ++j) {
        const __m256 kj = _mm256_loadu_ps(k + j * token);
        for (int i = 0; i < SEQ6; ++i) dq[i] = _mm256_fmadd_ps(_mm256_set1_ps(ds[i][j]), kj, dq[i]);
    }
    for (int i = 0; i < SEQ6; ++i) {
        const __m256 qi = _mm256_loadu_ps(q + i * token), goi = _mm256_loadu_ps(go + i * width);
        for (int j = 0; j < SEQ6; ++j) {
            dk[j] = _mm256_fmadd_ps(_mm256_set1_ps(ds[i][j]), qi, dk[j]);
            dv[j] = _mm256_fmadd_ps(_mm256_set1_ps(p[i * SEQ6 + j]), goi, dv[j]);
        }
    }
    for (int i = 0; i < SEQ6; ++i) {
        _mm256_storeu_ps(gq + i * token, dq[i]);
        _mm256_storeu_ps(gk + i * token, dk[i]);
        _mm256_storeu_ps(gv + i * token, dv[i]);
    }
}

/* out and probs ([batch, heads, seq, seq], kept for the backward) of one call; the ViT's shape
 * (6 tokens, head dim 8) has its own copy of the loops with constant bounds. */
void attention_forward_f32(const float *qkv, float *out, float *probs, int64_t batch, int64_t seq, int64_t heads,
                           int64_t dim, float scale, int threads, int generic_only) {
    const int64_t token = 3 * heads * dim, width = heads * dim;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const int64_t b = bh / heads, h = bh % heads;
        const float *q = qkv + b * seq * token + h * dim;
        float *o = out + b * seq * width + h * dim, *p = probs + bh * seq * seq;
        if (seq == SEQ6 && dim == DIM8 && !generic_only) {
            forward_6x8(q, q + width, q + 2 * width, o, p, token, width, scale);
        } else {
            float s[MAX_SEQ * MAX_SEQ], acc[MAX_SEQ * MAX_DIM];
            forward_one(q, q + width, q + 2 * width, o, p, seq, dim, token, width, scale, s, acc);
        }
    }
}

/* grad_qkv (same layout as qkv) from grad_out ([batch, seq, heads, head_dim], contiguous). */
void attention_backward_f32(const float *qkv, const float *probs, const float *grad_out, float *grad_qkv,
                            int64_t batch, int64_t seq, int64_t heads, int64_t dim, float scale, int threads, int generic_only) {
    const int64_t token = 3 * heads * dim, width = heads * dim;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const int64_t b = bh / heads, h = bh % heads;
        const float *q = qkv + b * seq * token + h * dim, *go = grad_out + b * seq * width + h * dim;
        const float *p = probs + bh * seq * seq;
        float *gq = grad_qkv + b * seq * token + h * dim;
        if (seq == SEQ6 && dim == DIM8 && !generic_only) {
            backward_6x8(q, q + width, q + 2 * width, p, go, gq, gq + width, gq + 2 * width, token, width, scale);
        } else {
            float ds[MAX_SEQ * MAX_SEQ], weighted[MAX_SEQ], dq[MAX_SEQ * MAX_DIM], dk[MAX_SEQ * MAX_DIM],
                dv[MAX_SEQ * MAX_DIM];
            backward_one(q, q + width, q + 2 * width, p, go, gq, gq + width, gq + 2 * width, seq, dim, token, width,
                         scale, ds, weighted, dq, dk, dv);
        }
    }
}

/* GELU (exact: x * Phi(x), Phi the normal CDF) and its gradient, elementwise. Phi from Abramowitz
 * & Stegun 7.1.26 for erfc (|error| < 1.5e-7, as ATen's vectorised erf), taken on |x| so that the
 * tail x < 0 is the small erfc itself, not 1 minus a number near 1. */
static inline void normal_cdf_pdf(float x, float *cdf, float *pdf) {
    const float z = fabsf(x) * 0.707106781186547524f;
    const float t = 1.0f / fmaf(0.3275911f, z, 1.0f);
    float poly = 1.061405429f;
    poly = fmaf(poly, t, -1.453152027f);
    poly = fmaf(poly, t, 1.421413741f);
    poly = fmaf(poly, t, -0.284496736f);
    poly = fmaf(poly, t, 0.254829592f);
    const float gauss = exp_nonpositive(-(z * z)); /* exp(-x^2 / 2) */
    const float half_erfc = 0.5f * (poly * t) * gauss;
    *cdf = x < 0.0f ? half_erfc : 1.0f - half_erfc;
    *pdf = gauss * 0.398942280401432678f;
}

/* normal_cdf_pdf on 8 lanes: the same operations in the same order, so the same bits. */
static inline void normal_cdf_pdf8(__m256 x, __m256 *cdf, __m256 *pdf) {
    const __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(0.707106781186547524f));
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), z, _mm256_set1_ps(1.0f)));
    __m256 poly = _mm256_set1_ps(1.061405429f);
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
    const __m256 gauss = exp_nonpositive8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(z, z)));
    const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_mul_ps(poly, t)), gauss);
    *cdf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc,
                            _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    *pdf = _mm256_mul_ps(gauss, _mm256_set1_ps(0.398942280401432678f));
}

void gelu_forward_f32(const float *x, float *y, int64_t n, int threads) {
    const int64_t blocks = n / 8;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        __m256 cdf, pdf;
        const __m256 xb = _mm256_loadu_ps(x + 8 * b);
        normal_cdf_pdf8(xb, &cdf, &pdf);
        _mm256_storeu_ps(y + 8 * b, _mm256_mul_ps(xb, cdf));
    }
    for (int64_t i = 8 * blocks; i < n; ++i) {
        float cdf, pdf;
        normal_cdf_pdf(x[i], &cdf, &pdf);
        y[i] = x[i] * cdf;
    }
}

void gelu_backward_f32(const float *x, const float *grad, float *grad_x, int64_t n, int threads) {
    const int64_t blocks = n / 8;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        __m256 cdf, pdf;
        const __m256 xb = _mm256_loadu_ps(x + 8 * b);
        normal_cdf_pdf8(xb, &cdf, &pdf);
        _mm256_storeu_ps(grad_x + 8 * b, _mm256_mul_ps(_mm256_loadu_ps(grad + 8 * b), _mm256_fmadd_ps(xb, pdf, cdf)));
    }
    for (int64_t i = 8 * blocks; i < n; ++i) {
        float cdf, pdf;
        normal_cdf_pdf(x[i], &cdf, &pdf);
        grad_x[i] = grad[i] * fmaf(x[i], pdf, cdf);
    }
}
