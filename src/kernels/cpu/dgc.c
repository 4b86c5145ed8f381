/* dgc.c - the CPU backends' Deep Gradient Compression kernels (Lin et al. 2018,
 * arXiv:1712.01887; Paddle's dgc op): momentum correction with local clipping and the
 * weight-decay correction, top-k selection (exact quickselect, or a sampled threshold refined to
 * the exact top k, fused with the accumulation), encoding with momentum factor masking,
 * scatter-add of all ranks' pairs and the SGD steps. Plain loops over f32; contracts in
 * dgc_kernels.h; tests/unit/test_dgc.c holds the float64 reference. */
#include "dgc_kernels.h"

#include <math.h>
#include <string.h>
/* dgc_accumulate over len entries; inlined with a constant len (BLOCK) the compiler vectorizes
 * it (the arrays never overlap). */
static inline void accumulate_span(int64_t len, const float *restrict grad,
                                   const float *restrict w, float *restrict u, float *restrict v,
                                   const dgc_accum_args *a) {
    const float c = (float)a->clip_scale, lam = (float)a->decay, m = (float)a->momentum;
    if (!a->correction) {
        for (int64_t i = 0; i < len; i++)
            v[i] += c * grad[i] + lam * w[i];
    } else if (a->nesterov) {
        for (int64_t i = 0; i < len; i++) {
            float g = c * grad[i] + lam * w[i];
            float ui = m * (u[i] + g);
            u[i] = ui;
            v[i] += ui + g;
        }
    } else {
        for (int64_t i = 0; i < len; i++) {
            float g = c * grad[i] + lam * w[i];
            float ui = m * u[i] + g;
            u[i] = ui;
            v[i] += ui;
        }
    }
}

#define BLOCK 32 /* entries per vectorized block of the accumulation passes */

void dgc_accumulate(int64_t n, const float *grad, const float *w, float *u, float *v,
                    const dgc_accum_args *a) {
    int64_t i0 = 0;
    for (; i0 + BLOCK <= n; i0 += BLOCK)
        accumulate_span(BLOCK, grad + i0, w + i0, u + i0, v + i0, a);
    accumulate_span(n - i0, grad + i0, w + i0, u + i0, v + i0, a);
}

/* The k-th largest (1-based, 1 <= k <= n) of a[0..n), by quickselect (Hoare partition around
 * the median of three); reorders a. */
static float kth_largest(float *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1, target = k - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float pivot = x > y ? (y > z ? y : (x > z ? z : x)) : (x > z ? x : (y > z ? z : y));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot)
                i++;
            while (a[j] < pivot)
                j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        /* [lo, j] >= pivot, [i, hi] <= pivot, (j, i) == pivot */
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            return a[target];
    }
    return a[target];
}

int64_t dgc_select_exact(int64_t n, const float *v, int64_t k, int32_t *idx, float *scratch) {
    if (k <= 0 || n <= 0)
        return 0;
    if (k > n)
        k = n;
    for (int64_t i = 0; i < n; i++)
        scratch[i] = fabsf(v[i]);
    float tau = kth_largest(scratch, n, k);
    /* those above tau from the front, ties at tau from the back, in one pass */
    int64_t front = 0, back = n;
    for (int64_t i = 0; i < n; i++) {
        float m = fabsf(v[i]);
        if (m > tau)
            idx[front++] = (int32_t)i;
        else if (m == tau && tau > 0)
            idx[--back] = (int32_t)i;
    }
    int64_t ties = n - back, take = k - front < ties ? k - front : ties;
    memmove(idx + front, idx + back, (size_t)take * sizeof *idx);
    return front + take;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

#define SAMPLE_MIN 4096
#define CHUNK 16 /* the fused path samples runs of 16 values: one cache line per array */

static int64_t sample_size(int64_t n) {
    return n / 100 > SAMPLE_MIN ? n / 100 : SAMPLE_MIN;
}

/* The candidates idx[0..count) hold every entry of the top k (count > k allowed): keeps exactly
 * the top k of them (mag: count floats of scratch). count <= k: all of them are the answer. */
static int64_t refine(const float *v, int64_t k, int32_t *idx, int64_t count, float *mag) {
    if (count <= k)
        return count;
    for (int64_t j = 0; j < count; j++)
        mag[j] = fabsf(v[idx[j]]);
    float t2 = kth_largest(mag, count, k);
    int64_t above = 0;
    for (int64_t j = 0; j < count; j++)
        above += mag[j] > t2;
    int64_t out = 0, ties = k - above;
    for (int64_t j = 0; j < count; j++) {
        float a = fabsf(v[idx[j]]);
        if (a > t2 || (a == t2 && ties-- > 0))
            idx[out++] = idx[j];
    }
    return out;
}

/* The sample's r-th largest magnitude for about `want` entries at or above it over n. */
static float threshold_for(float *sample, int64_t m, int64_t n, double want) {
    int64_t r = (int64_t)ceil(want * (double)m / (double)n);
    r = r < 1 ? 1 : r > m ? m : r;
    return kth_largest(sample, m, r);
}

int64_t dgc_select_sampled(int64_t n, const float *v, int64_t k, int32_t *idx, float *scratch,
                           uint64_t seed, int *passes) {
    if (passes)
        *passes = 1;
    if (k <= 0 || n <= 0)
        return 0;
    if (k > n / 64 || n < 4 * SAMPLE_MIN)
        return dgc_select_exact(n, v, k, idx, scratch);
    int64_t m = sample_size(n);
    uint64_t st = seed;
    for (int64_t j = 0; j < m; j++)
        scratch[j] = fabsf(v[splitmix64(&st) % (uint64_t)n]);
    /* aim at 2k candidates: the threshold is the sample's r-th largest, r = 2k * m / n */
    double want = 2.0 * (double)k;
    for (int pass = 1; pass <= 3; pass++) {
        if (passes)
            *passes = pass;
        float tau = threshold_for(scratch, m, n, want);
        int64_t count = 0;
        for (int64_t i = 0; i < n; i++) {
            float a = fabsf(v[i]);
            if (a >= tau && a > 0)
                idx[count++] = (int32_t)i;
        }
        if (count < k && tau > 0) {
            want *= 4; /* too few above the threshold: lower it */
            continue;
        }
        return refine(v, k, idx, count, scratch + m);
    }
    if (passes)
        *passes = 4;
    return dgc_select_exact(n, v, k, idx, scratch);
}

/* The fused pass: accumulates v (and u) like dgc_accumulate and appends to idx the index of
 * each new v with tau <= |v| (and v != 0), ascending; returns their number. Each block of
 * BLOCK entries is accumulated and tested for a candidate by vectorized loops; only the rare
 * block holding one is scanned again to gather it. */
static inline int64_t gather_span(int64_t i0, int64_t len, const float *v, float tau,
                                  int32_t *idx, int64_t count) {
    for (int64_t t = 0; t < len; t++) {
        float mag = fabsf(v[i0 + t]);
        if (mag >= tau && mag > 0)
            idx[count++] = (int32_t)(i0 + t);
    }
    return count;
}

static int64_t gather_pass(int64_t n, const float *grad, const float *w, float *u, float *v,
                           const dgc_accum_args *a, float tau, int32_t *idx) {
    int64_t count = 0, i0 = 0;
    for (; i0 + BLOCK <= n; i0 += BLOCK) {
        accumulate_span(BLOCK, grad + i0, w + i0, u + i0, v + i0, a);
        const float *vb = v + i0;
        int hit = 0;
        for (int t = 0; t < BLOCK; t++)
            hit |= fabsf(vb[t]) >= tau;
        if (hit)
            count = gather_span(i0, BLOCK, v, tau, idx, count);
    }
    accumulate_span(n - i0, grad + i0, w + i0, u + i0, v + i0, a); /* the tail */
    return gather_span(i0, n - i0, v, tau, idx, count);
}

/* The smallest magnitude among the chosen entries: the k-th largest when count = k. */
static float smallest_chosen(const float *v, const int32_t *idx, int64_t count) {
    float lo = INFINITY;
    for (int64_t j = 0; j < count; j++)
        lo = fabsf(v[idx[j]]) < lo ? fabsf(v[idx[j]]) : lo;
    return lo;
}

#define HINT_MARGIN 0.9f /* the threshold from a hint: this much below last step's k-th value */

int64_t dgc_accumulate_select(int64_t n, const float *grad, const float *w, float *u, float *v,
                              const dgc_accum_args *a, int64_t k, int32_t *idx, float *scratch,
                              uint64_t seed, float *hint, int *passes) {
    if (passes)
        *passes = 0;
    if (k <= 0 || n <= 0 || k > n / 64 || n < 4 * SAMPLE_MIN) {
        dgc_accumulate(n, grad, w, u, v, a);
        if (passes)
            *passes = 1;
        int64_t got = dgc_select_exact(n, v, k, idx, scratch);
        if (hint)
            *hint = got == k && k > 0 ? smallest_chosen(v, idx, got) : 0;
        return got;
    }
    float tau;
    if (hint && *hint > 0 && isfinite(*hint)) {
        tau = *hint * HINT_MARGIN;
    } else { /* the sample, from the values the accumulation is about to produce */
        const float c = (float)a->clip_scale, lam = (float)a->decay, mo = (float)a->momentum;
        int64_t m = sample_size(n) / CHUNK * CHUNK;
        uint64_t st = seed;
        for (int64_t j = 0; j < m; j += CHUNK) {
            int64_t at = (int64_t)(splitmix64(&st) % (uint64_t)(n - CHUNK + 1));
            for (int64_t t = 0; t < CHUNK; t++) {
                int64_t i = at + t;
                float g = c * grad[i] + lam * w[i], nv;
                if (!a->correction)
                    nv = v[i] + g;
                else if (a->nesterov)
                    nv = v[i] + (mo * (u[i] + g) + g);
                else
                    nv = v[i] + (mo * u[i] + g);
                scratch[j + t] = fabsf(nv);
            }
        }
        tau = threshold_for(scratch, m, n, 2.0 * (double)k);
    }
    /* one pass: accumulate, and gather the entries at or above tau */
    int64_t count = gather_pass(n, grad, w, u, v, a, tau, idx), got;
    if (count >= k || tau == 0) {
        got = refine(v, k, idx, count, scratch);
    } else { /* the threshold was too high: select on the accumulated v */
        int p = 0;
        got = dgc_select_sampled(n, v, k, idx, scratch, seed ^ 0x5bd1e995u, &p);
        if (passes)
            *passes = p;
    }
    if (hint)
        *hint = got == k && k > 0 ? smallest_chosen(v, idx, got) : 0;
    return got;
}

void dgc_encode(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                dgc_pair *pairs) {
    for (int64_t j = 0; j < count; j++) {
        int32_t i = idx[j];
        pairs[j].index = (int32_t)(base + i);
        pairs[j].value = v[i];
        v[i] = 0;
        if (u)
            u[i] = 0;
    }
}

/* The segment holding index i: start[s] <= i < start[s + 1] (binary search). */
static int segment_of(int64_t i, int nseg, const int64_t *start) {
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

int64_t dgc_scatter_add(const dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                        float *const *dst) {
    for (int64_t j = 0; j < n; j++) {
        int64_t i = pairs[j].index;
        if (i < 0 || i >= start[nseg])
            return j;
        int s = segment_of(i, nseg, start);
        dst[s][i - start[s]] += pairs[j].value;
    }
    return -1;
}

void dgc_apply_pairs(const dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                     float *const *w, double step) {
    for (int64_t j = 0; j < n; j++) {
        int64_t i = pairs[j].index;
        int s = segment_of(i, nseg, start);
        float *wi = &w[s][i - start[s]];
        *wi = (float)((double)*wi - step * (double)pairs[j].value);
    }
}

void dgc_apply_dense(int64_t n, float *w, float *g, float *u, double lr, double inv_n, double m,
                     bool nesterov, double decay) {
    /* G = 0 after: the caller scatter-adds the next step's pairs into a cleared buffer */
    for (int64_t i = 0; i < n; i++) {
        double d = (double)g[i] * inv_n + decay * (double)w[i];
        double stepv = d;
        if (u) {
            double ui = m * (double)u[i] + d;
            u[i] = (float)ui;
            stepv = nesterov ? d + m * ui : ui;
        }
        w[i] = (float)((double)w[i] - lr * stepv);
        g[i] = 0;
    }
}
