/* test_dgc.c - Deep Gradient Compression's arithmetic (src/strategy/dgc_math.c) against a plain
 * float64 reference written here: the warm-up schedule (seed 000's example), k = ceil(numel *
 * (1 - s)), the dense-fallback rule, local clipping's threshold, momentum correction (plain,
 * Nesterov, off) with clipping and the weight-decay correction, top-k selection (exact, sampled,
 * and fused with the accumulation; empty selections, ties, zeros), encoding with momentum
 * factor masking, scatter-add and pair-by-pair application of ranks that send different
 * counts, and the SGD steps; then N simulated ranks at sparsity 0 without masking against dense
 * Momentum; and on a job of one: local clipping through the strategy, and its checkpoint state
 * (names, and writing it back restores training exactly). */
#include "fleet/fleet.h"
#include "fleet/rng.h"
#include "kernels/cpu/dgc_kernels.h"
#include "strategy/dgc_math.h"
#include "test.h"

#include <stdint.h>

static const double ramp[] = {0.75, 0.9375, 0.984375, 0.996, 0.999};

static void test_schedule(void) {
    /* seed 000: rampup_step 100, five sparsities: steps 0-19 0.75, 20-39 0.9375, ... */
    for (int64_t step = 0; step < 130; step++) {
        double want = step < 20 ? 0.75 : step < 40 ? 0.9375 : step < 60 ? 0.984375
                    : step < 80 ? 0.996 : 0.999;
        CHECK(dgc_sparsity_at(step, 0, 100, ramp, 5, true) == want);
    }
    /* rampup_begin_step: dense (-1) before it; the ramp counts from it */
    CHECK(dgc_sparsity_at(9, 10, 100, ramp, 5, true) == -1);
    CHECK(dgc_sparsity_at(10, 10, 100, ramp, 5, true) == 0.75);
    CHECK(dgc_sparsity_at(29, 10, 100, ramp, 5, true) == 0.75);
    CHECK(dgc_sparsity_at(30, 10, 100, ramp, 5, true) == 0.9375);
    CHECK(dgc_sparsity_at(1000000, 10, 100, ramp, 5, true) == 0.999);
    /* seed 000's second example: 1252 * 3 steps over three values */
    const double three[] = {0.984375, 0.996, 0.999};
    CHECK(dgc_sparsity_at(2504 - 1, 2504, 3756, three, 3, true) == -1);
    CHECK(dgc_sparsity_at(2504 + 1251, 2504, 3756, three, 3, true) == 0.984375);
    CHECK(dgc_sparsity_at(2504 + 1252, 2504, 3756, three, 3, true) == 0.996);
    CHECK(dgc_sparsity_at(2504 + 2504, 2504, 3756, three, 3, true) == 0.999);
    /* warm-up off: the last value from the begin step on */
    CHECK(dgc_sparsity_at(10, 10, 100, ramp, 5, false) == 0.999);
    CHECK(dgc_sparsity_at(9, 10, 100, ramp, 5, false) == -1);
    /* one value, rampup_step 1 (Paddle's defaults) */
    const double one[] = {0.999};
    CHECK(dgc_sparsity_at(0, 0, 1, one, 1, true) == 0.999);
}

static void test_k_and_rules(void) {
    /* k = ceil(numel * (1 - s)), computed here in integers: s given in millionths */
    struct { int64_t numel, s_ppm; } c[] = {
        {1000, 999000}, {16384, 999000}, {100, 0}, {0, 500000}, {3, 500000}, {25000000, 999000},
        {4194304, 999000}, {1, 999999}, {1024, 750000}, {1000, 937500}, {12345678, 996000},
        {7, 984375},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int64_t want = (c[i].numel * (1000000 - c[i].s_ppm) + 999999) / 1000000;
        int64_t got = dgc_k(c[i].numel, (double)c[i].s_ppm / 1e6);
        if (got != want) {
            fprintf(stderr, "dgc_k(%lld, %g) = %lld, want %lld\n", (long long)c[i].numel,
                    (double)c[i].s_ppm / 1e6, (long long)got, (long long)want);
            test_failures++;
        }
    }
    /* allgather pays while N * (1 - s) * 2 < 1 (seed 000: 32 workers at 0.75 send 8x dense) */
    const dgc_exchange AG = DGC_EXCHANGE_ALLGATHER, SP = DGC_EXCHANGE_SPARSE,
                       AU = DGC_EXCHANGE_AUTO;
    CHECK(dgc_sparse_pays(2, 0.999, AG, 4) && dgc_sparse_pays(4, 0.9375, AG, 4) &&
          dgc_sparse_pays(1, 0.6, AG, 4));
    CHECK(!dgc_sparse_pays(2, 0.75, AG, 4) && !dgc_sparse_pays(32, 0.75, AG, 4) &&
          !dgc_sparse_pays(2, 0, AG, 4));
    CHECK(!dgc_sparse_pays(4, 0.875, AG, 4) && dgc_sparse_pays(4, 0.9, AG, 4));
    /* the sparse allreduce sends ~(1 + 4) k whatever N: pays while 5 (1 - s) 2 < 1 */
    CHECK(dgc_sparse_pays(1024, 0.95, SP, 4) && !dgc_sparse_pays(1024, 0.88, SP, 4) &&
          !dgc_sparse_pays(2, 0.8, SP, 4) && dgc_sparse_pays(2, 0.92, SP, 4) &&
          dgc_sparse_pays(1, 0.6, SP, 4));
    CHECK(dgc_sparse_pays(32, 0.9375, AU, 4) && !dgc_sparse_pays(32, 0.75, AU, 4) &&
          dgc_sparse_pays(2, 0.8, AU, 4));
    /* the estimate: allgather g(8 k N) alpha + 8 k (N - 1) beta; sparse ((N - 1) + 2 ceil(log2
     * N) + g(8 k 4) + 2 rd(N)) alpha + 8 k (1 + 4) (N - 1) / N beta; g is Bruck's ceil(log2 N)
     * up to 1 MiB, else N - 1; rd(8) = 3, rd(5) = 2 + 2 */
    CHECK_NEAR(dgc_exchange_seconds(AG, 8, 1000, 4), 3 * 50e-6 + 7 * 8000 * 8e-9, 1e-15);
    CHECK_NEAR(dgc_exchange_seconds(AG, 8, 100000, 4), 7 * (50e-6 + 800000 * 8e-9), 1e-15);
    CHECK_NEAR(dgc_exchange_seconds(SP, 8, 1000, 4), 22 * 50e-6 + 40000 * 7.0 / 8 * 8e-9, 1e-15);
    CHECK_NEAR(dgc_exchange_seconds(SP, 5, 1000, 4), 21 * 50e-6 + 40000 * 4.0 / 5 * 8e-9, 1e-15);
    CHECK_NEAR(dgc_exchange_seconds(SP, 8, 100000, 4), 26 * 50e-6 + 4000000 * 7.0 / 8 * 8e-9,
               1e-15);
    CHECK(dgc_exchange_seconds(AG, 1, 1000, 4) == 0 && dgc_exchange_seconds(SP, 1, 1000, 4) == 0);
    /* auto: one rank and few pairs allgather; ResNet-50's 25.6k pairs at 0.999: sparse from 8 */
    CHECK(dgc_choose_exchange(AU, 1, 1 << 20, 0.999, 4) == AG);
    CHECK(dgc_choose_exchange(SP, 1, 100, 0.999, 4) == AG);
    CHECK(dgc_choose_exchange(AU, 8, 100, 0.999, 4) == AG);
    CHECK(dgc_choose_exchange(AU, 2, 25600, 0.999, 4) == AG);
    CHECK(dgc_choose_exchange(AU, 4, 25600, 0.999, 4) == AG);
    CHECK(dgc_choose_exchange(AU, 8, 25600, 0.999, 4) == SP);
    CHECK(dgc_choose_exchange(AU, 128, 25600, 0.999, 4) == SP);
    CHECK(dgc_choose_exchange(SP, 2, 10, 0.999, 4) == SP);
    CHECK(dgc_choose_exchange(AG, 64, 1000000, 0.999, 4) == AG);
    /* the budget (dgc_configs.sparse_budget) in both rules: budget 1 pays while 2 (1 - s) 2 < 1,
     * budget 8 while 9 (1 - s) 2 < 1; budget 8 at 8 ranks, k = 1000: 22 rounds (the kept sums'
     * 64 000 bytes still Bruck's), 8 k 9 (N - 1) / N bytes; budget 32 at 8 ranks, k = 10 000:
     * the kept sums are 2.56 MB, the ring's 7 rounds: 26 */
    CHECK(dgc_sparse_pays(1024, 0.8, SP, 1) && !dgc_sparse_pays(1024, 0.74, SP, 1));
    CHECK(dgc_sparse_pays(1024, 0.95, SP, 8) && !dgc_sparse_pays(1024, 0.94, SP, 8));
    CHECK_NEAR(dgc_exchange_seconds(SP, 8, 1000, 8), 22 * 50e-6 + 72000 * 7.0 / 8 * 8e-9, 1e-15);
    CHECK_NEAR(dgc_exchange_seconds(SP, 8, 10000, 32),
               26 * 50e-6 + 80000 * 33 * 7.0 / 8 * 8e-9, 1e-15);
    CHECK(dgc_exchange_seconds(AG, 8, 1000, 1) == dgc_exchange_seconds(AG, 8, 1000, 32));
    /* above 8 ranks Bruck's allgather also up to 256 KiB per round it saves: at 128 ranks
     * (120 saved, 30 MiB) budget 8's 1.6 MB of kept sums take 7 rounds, not the ring's 127:
     * 127 + 14 + 7 + 14 = 162 rounds; allgather's 26 MB also 7 */
    CHECK_NEAR(dgc_exchange_seconds(SP, 128, 25600, 8),
               162 * 50e-6 + 204800 * 9 * 127.0 / 128 * 8e-9, 1e-12);
    CHECK_NEAR(dgc_exchange_seconds(AG, 128, 25600, 8), 7 * 50e-6 + 127 * 204800 * 8e-9, 1e-12);
    CHECK_NEAR(dgc_exchange_seconds(AG, 128, 40000, 8), 127 * 50e-6 + 127 * 320000 * 8e-9,
               1e-12); /* 40.96 MB gathered: the ring */
    /* a large budget makes the sparse allreduce dearer than allgather for 8 ranks */
    CHECK(dgc_choose_exchange(AU, 8, 25600, 0.999, 4) == SP &&
          dgc_choose_exchange(AU, 8, 25600, 0.999, 16) == AG);
    /* the default budget, 7: ResNet-50's k at 0.999 by allgather at 8 workers, sparse from
     * 16; warm-up's 0.9375 pays with neither from 8 workers ((1 + 7)(1 - s) 2 = 1), 0.984375
     * does */
    CHECK(DGC_SPARSE_BUDGET == 7);
    CHECK(dgc_choose_exchange(AU, 8, 25504, 0.999, DGC_SPARSE_BUDGET) == AG &&
          dgc_choose_exchange(AU, 16, 25504, 0.999, DGC_SPARSE_BUDGET) == SP);
    CHECK(!dgc_sparse_pays(128, 0.9375, AU, DGC_SPARSE_BUDGET) &&
          dgc_sparse_pays(7, 0.9375, AU, DGC_SPARSE_BUDGET) &&
          dgc_sparse_pays(128, 0.984375, AU, DGC_SPARSE_BUDGET));
    /* auto takes the one that pays when only one does: 32 workers at 0.9375, few pairs */
    CHECK(dgc_choose_exchange(AU, 32, 10, 0.9375, 4) == SP);
    /* the return of dropped pairs: kept -> u masked (when masking), dropped -> back to v */
    {
        int32_t idx[4] = {0, 2, 4, 5}, masked[4];
        const float val[4] = {-1.5f, 2.5f, 7, -3};
        const uint8_t kept[4] = {1, 0, 1, 0};
        dgc_pair back[4];
        int64_t nm = -1, nb = -1;
        dgc_settle_split(4, idx, val, kept, true, masked, &nm, back, &nb);
        CHECK(nm == 2 && masked[0] == 0 && masked[1] == 4);
        CHECK(nb == 2 && back[0].index == 2 && back[0].value == 2.5f && back[1].index == 5 &&
              back[1].value == -3);
        dgc_settle_split(4, idx, val, kept, false, masked, &nm, back, &nb);
        CHECK(nm == 0 && nb == 2);
        dgc_settle_split(4, idx, val, kept, true, idx, &nm, back, &nb); /* in place */
        CHECK(nm == 2 && idx[0] == 0 && idx[1] == 4 && nb == 2 && back[1].index == 5);
    }
    /* local clipping at clip_norm * N^(-1/2) */
    CHECK_NEAR(dgc_local_clip_norm(2.0, 4), 1.0, 1e-15);
    CHECK_NEAR(dgc_local_clip_norm(1.0, 2), 0.70710678118654752, 1e-15);
    CHECK_NEAR(dgc_local_clip_norm(5.0, 1), 5.0, 1e-15);
}

static void fill(fl_rng *r, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * fl_rng_normal(r));
}

/* Momentum correction, Nesterov and off, with clipping and the weight-decay correction, over
 * three steps against the paper's formulas in double. */
static void test_accumulate(void) {
    enum { N = 777 };
    static float g[N], w[N], u[N], v[N], g0[N];
    static double ur[N], vr[N], got[N], want[N];
    fl_rng r;
    fl_rng_init(&r, 5, 0);
    for (int mode = 0; mode < 3; mode++) { /* 0 plain, 1 Nesterov, 2 correction off */
        dgc_accum_args a = {.clip_scale = 0.625, .decay = 1e-2, .momentum = 0.9,
                            .nesterov = mode == 1, .correction = mode != 2};
        fill(&r, w, N, 1);
        fill(&r, u, N, 0.5);
        fill(&r, v, N, 0.5);
        for (int i = 0; i < N; i++)
            ur[i] = u[i], vr[i] = v[i];
        for (int step = 0; step < 3; step++) {
            fill(&r, g, N, 1);
            memcpy(g0, g, sizeof g);
            dgc_accumulate(N, g, w, u, v, &a);
            for (int i = 0; i < N; i++) {
                double gi = 0.625 * (double)g0[i] + 1e-2 * (double)w[i];
                if (mode == 0) {
                    ur[i] = 0.9 * ur[i] + gi; /* u = m u + g, v = v + u */
                    vr[i] = vr[i] + ur[i];
                } else if (mode == 1) {
                    ur[i] = 0.9 * (ur[i] + gi); /* u = m (u + g), v = v + u + g */
                    vr[i] = vr[i] + ur[i] + gi;
                } else {
                    vr[i] = vr[i] + gi; /* v = v + g */
                }
            }
            CHECK(memcmp(g, g0, sizeof g) == 0); /* the gradient is only read */
        }
        for (int i = 0; i < N; i++)
            got[i] = v[i], want[i] = vr[i];
        CHECK_CLOSE("v", got, want, N, 1e-5, 1e-5);
        for (int i = 0; i < N; i++)
            got[i] = u[i], want[i] = ur[i];
        CHECK_CLOSE("u", got, want, N, 1e-5, 1e-5);
    }
}

/* The reference selection: the magnitudes of the k largest nonzero |v|, sorted descending. */
static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void check_selection(const char *what, int64_t n, const float *v, int64_t k,
                            const int32_t *idx, int64_t cnt) {
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    double *sel = malloc((size_t)(cnt ? cnt : 1) * sizeof *sel);
    int64_t nz = 0;
    for (int64_t i = 0; i < n; i++)
        if (v[i] != 0)
            ref[nz++] = fabs((double)v[i]);
    qsort(ref, (size_t)nz, sizeof *ref, cmp_desc);
    int64_t want = k < nz ? k : nz;
    if (cnt != want) {
        fprintf(stderr, "%s: n %lld k %lld: selected %lld, want %lld\n", what, (long long)n,
                (long long)k, (long long)cnt, (long long)want);
        test_failures++;
        goto done;
    }
    char *seen = calloc((size_t)(n ? n : 1), 1);
    for (int64_t j = 0; j < cnt; j++) {
        if (idx[j] < 0 || idx[j] >= n || seen[idx[j]]) {
            fprintf(stderr, "%s: index %d out of range or repeated\n", what, idx[j]);
            test_failures++;
            break;
        }
        seen[idx[j]] = 1;
        sel[j] = fabs((double)v[idx[j]]);
    }
    free(seen);
    qsort(sel, (size_t)cnt, sizeof *sel, cmp_desc);
    CHECK_CLOSE(what, sel, ref, cnt, 0, 0); /* the same magnitudes: the top k up to ties */
done:
    free(ref);
    free(sel);
}

static void test_select(void) {
    const int64_t sizes[] = {0, 1, 7, 1000, 16384, 100000, 300001};
    fl_rng r;
    fl_rng_init(&r, 11, 0);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        float *v = malloc((size_t)(n + 1) * sizeof *v);
        int64_t sample = n / 100 > 4096 ? n / 100 : 4096;
        float *scratch = malloc((size_t)(n + sample + 1) * sizeof(float));
        int32_t *idx = malloc((size_t)(n + 1) * sizeof *idx);
        for (int kind = 0; kind < 4; kind++) {
            /* 0 normal, 1 half zeros, 2 all zeros (empty selection), 3 few magnitudes (ties) */
            for (int64_t i = 0; i < n; i++) {
                double x = fl_rng_normal(&r);
                v[i] = kind == 0   ? (float)x
                     : kind == 1   ? (fl_rng_below(&r, 2) ? (float)x : 0.0f)
                     : kind == 2   ? 0.0f
                                   : (float)((x < 0 ? -1 : 1) * (double)(1 + fl_rng_below(&r, 3)));
            }
            const double sps[] = {0, 0.5, 0.9, 0.999, 0.9999};
            for (size_t s = 0; s < sizeof sps / sizeof sps[0]; s++) {
                int64_t k = dgc_k(n, sps[s]);
                char what[96];
                snprintf(what, sizeof what, "exact n %lld kind %d s %g", (long long)n, kind,
                         sps[s]);
                check_selection(what, n, v, k, idx, dgc_select_exact(n, v, k, idx, scratch));
                int passes = 0;
                int64_t cnt = dgc_select_sampled(n, v, k, idx, scratch, 99 + s, &passes);
                snprintf(what, sizeof what, "sampled n %lld kind %d s %g (%d passes)",
                         (long long)n, kind, sps[s], passes);
                check_selection(what, n, v, k, idx, cnt);
                CHECK(passes >= 1 && passes <= 4);
            }
        }
        /* a sample that misses the few large entries still finds them (more passes or exact) */
        if (n >= 100000) {
            for (int64_t i = 0; i < n; i++)
                v[i] = (float)(1e-3 * fl_rng_normal(&r));
            for (int j = 0; j < 50; j++)
                v[fl_rng_below(&r, (uint64_t)n)] = 100.0f + (float)j;
            int passes = 0;
            int64_t cnt = dgc_select_sampled(n, v, 40, idx, scratch, 1, &passes);
            check_selection("sampled, 50 outliers, k 40", n, v, 40, idx, cnt);
        }
        free(v);
        free(scratch);
        free(idx);
    }
}

/* The fused accumulate + select: the same u and v as dgc_accumulate, and the top k of the new
 * v, for each accumulation mode, on tensors where it samples and where it does not; and the
 * same from every threshold hint: none, last step's k-th value (no sample, no extra pass), one
 * far too high (too few candidates: the fallback pass) and one far too low (most entries are
 * candidates). The hint returned is the k-th largest |v|. */
static void test_accumulate_select(void) {
    const int64_t sizes[] = {1000, 70000, 262144};
    fl_rng r;
    fl_rng_init(&r, 23, 0);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        size_t fb = (size_t)n * sizeof(float);
        float *g = malloc(fb), *w = malloc(fb), *u = malloc(fb), *v = malloc(fb);
        float *g2 = malloc(fb), *u2 = malloc(fb), *v2 = malloc(fb);
        float *u0 = malloc(fb), *v0 = malloc(fb);
        float *scratch = malloc(fb + (size_t)(n / 100 + 4096) * sizeof(float));
        int32_t *idx = malloc((size_t)n * sizeof *idx), *idx0 = malloc((size_t)n * sizeof *idx);
        for (int mode = 0; mode < 3; mode++) {
            dgc_accum_args a = {.clip_scale = 0.5, .decay = 1e-3, .momentum = 0.9,
                                .nesterov = mode == 1, .correction = mode != 2};
            fill(&r, w, n, 1);
            fill(&r, u, n, 1);
            fill(&r, v, n, 3);
            for (int step = 0; step < 3; step++) {
                fill(&r, g, n, 1);
                /* step 2: heavy entries at block edges of the fused pass and in its tail */
                const int64_t planted[] = {0, 31, 32, n / 2, n - 17, n - 1};
                for (int j = 0; step == 2 && j < 6; j++)
                    v[planted[j]] = (j % 2 ? -1e3f : 1e3f) * (float)(j + 1);
                memcpy(g2, g, fb);
                memcpy(u2, u, fb);
                memcpy(v2, v, fb);
                dgc_accumulate(n, g2, w, u2, v2, &a);
                memcpy(u0, u, fb);
                memcpy(v0, v, fb);
                int64_t k = dgc_k(n, step == 1 ? 0.999 : 0.99), cnt0 = 0;
                float kth = 0;
                for (int hv = 0; hv < 4; hv++) { /* 0: none, 1: right, 2: too high, 3: too low */
                    memcpy(u, u0, fb);
                    memcpy(v, v0, fb);
                    float hint = hv == 0 ? 0 : hv == 1 ? kth : hv == 2 ? kth * 10 : kth * 1e-3f;
                    int passes = -1;
                    int64_t cnt = dgc_accumulate_select(n, g, w, u, v, &a, k, idx, scratch,
                                                        (uint64_t)step, &hint, &passes);
                    CHECK(memcmp(u, u2, fb) == 0 && memcmp(v, v2, fb) == 0);
                    CHECK(memcmp(g, g2, fb) == 0); /* read only, as by dgc_accumulate */
                    CHECK(passes >= 0 && passes <= 4);
                    char what[128];
                    snprintf(what, sizeof what, "fused n %lld mode %d k %lld hint %d (%d extra "
                             "passes)", (long long)n, mode, (long long)k, hv, passes);
                    check_selection(what, n, v, k, idx, cnt);
                    if (hv == 0) { /* the reference for the hinted runs */
                        kth = hint;
                        cnt0 = cnt;
                        memcpy(idx0, idx, (size_t)cnt * sizeof *idx);
                        float lo = INFINITY;
                        for (int64_t q = 0; q < cnt; q++)
                            lo = fabsf(v[idx[q]]) < lo ? fabsf(v[idx[q]]) : lo;
                        CHECK(cnt != k || hint == lo);
                    } else { /* the same entries in the same order, and the same hint out */
                        CHECK(cnt == cnt0 && memcmp(idx, idx0, (size_t)cnt * sizeof *idx) == 0);
                        CHECK(hint == kth);
                        if (n >= 4 * 4096 && k <= n / 64) /* where the fused path samples */
                            CHECK(hv != 1 || passes == 0); /* a right hint: no extra pass */
                    }
                    for (int j = 0; step == 2 && j < 6; j++) {
                        bool found = false;
                        for (int64_t q = 0; q < cnt; q++)
                            found |= idx[q] == (int32_t)planted[j];
                        if (!found)
                            fprintf(stderr, "  %s: planted index %lld not chosen\n", what,
                                    (long long)planted[j]);
                        CHECK(found);
                    }
                }
            }
        }
        free(g), free(w), free(u), free(v), free(g2), free(u2), free(v2), free(u0), free(v0);
        free(scratch);
        free(idx), free(idx0);
    }
}

static void test_encode(void) {
    float v[10], u[10], v0[10], u0[10];
    for (int i = 0; i < 10; i++)
        v[i] = v0[i] = (float)(i + 1) * (i % 2 ? -1.0f : 1.0f), u[i] = u0[i] = 0.5f * (float)i;
    int32_t idx[3] = {9, 0, 4};
    dgc_pair p[3];
    dgc_encode(idx, 3, 1000, v, u, p); /* masking on */
    for (int j = 0; j < 3; j++)
        CHECK(p[j].index == 1000 + idx[j] && p[j].value == v0[idx[j]]);
    for (int i = 0; i < 10; i++) {
        int sent = i == 9 || i == 0 || i == 4;
        CHECK(v[i] == (sent ? 0 : v0[i]));
        CHECK(u[i] == (sent ? 0 : u0[i])); /* momentum factor masking */
    }
    memcpy(v, v0, sizeof v);
    memcpy(u, u0, sizeof u);
    dgc_encode(idx, 3, 0, v, NULL, p); /* masking off: u untouched */
    CHECK(memcmp(u, u0, sizeof u) == 0 && v[9] == 0 && v[1] == v0[1] && p[0].index == 9);
    dgc_encode(idx, 0, 0, v, u, p); /* nothing selected: nothing changes */
    CHECK(memcmp(u, u0, sizeof u) == 0);
    /* the wire format: 8 bytes, index then value */
    CHECK(sizeof(dgc_pair) == 8 && offsetof(dgc_pair, value) == 4);
}

/* Three "ranks" send 0, 4 and 7 pairs (repeated indices across ranks) into three segments. */
static void test_scatter_apply(void) {
    const int64_t start[] = {0, 5, 6, 16};
    float g0[5] = {0}, g1[1] = {0}, g2[10] = {0};
    float w0[5], w1[1], w2[10];
    float *g[] = {g0, g1, g2}, *w[] = {w0, w1, w2};
    double G[16] = {0}, W[16];
    for (int i = 0; i < 16; i++) {
        W[i] = 0.1 * i - 0.7;
        int s = i < 5 ? 0 : i < 6 ? 1 : 2;
        w[s][i - start[s]] = (float)W[i];
    }
    dgc_pair p[] = {
        /* rank 1 */ {0, 1.5f}, {5, -2.0f}, {15, 0.25f}, {7, 3.0f},
        /* rank 2 */ {7, -1.0f}, {0, 0.5f}, {4, 2.0f}, {10, -0.75f}, {15, 0.25f}, {6, 1.0f},
        {6, -1.0f}, /* sums to zero: applied as no change */
    };
    int64_t n = (int64_t)(sizeof p / sizeof p[0]);
    CHECK(dgc_scatter_add(p, n, 3, start, g) == -1);
    for (int64_t j = 0; j < n; j++)
        G[p[j].index] += p[j].value;
    for (int i = 0; i < 16; i++) {
        int s = i < 5 ? 0 : i < 6 ? 1 : 2;
        CHECK_NEAR(g[s][i - start[s]], G[i], 1e-7);
    }
    double step = 0.1 / 3; /* lr / N: the pairs applied one by one are the sum's step */
    CHECK(dgc_check_pairs(p, n, 16) == -1);
    dgc_apply_pairs(p, n, 3, start, w, step);
    for (int i = 0; i < 16; i++) {
        int s = i < 5 ? 0 : i < 6 ? 1 : 2;
        CHECK_NEAR(w[s][i - start[s]], W[i] - step * G[i], 1e-6);
    }
    /* nothing received is a normal step; an index outside the space is reported */
    CHECK(dgc_scatter_add(p, 0, 3, start, g) == -1 && dgc_check_pairs(p, 0, 16) == -1);
    dgc_pair bad[] = {{3, 1.0f}, {16, 1.0f}, {2, 1.0f}};
    CHECK(dgc_scatter_add(bad, 3, 3, start, g) == 1 && dgc_check_pairs(bad, 3, 16) == 1);
    dgc_pair neg[] = {{-1, 1.0f}};
    CHECK(dgc_scatter_add(neg, 1, 3, start, g) == 0 && dgc_check_pairs(neg, 1, 16) == 0);
}

static void test_apply_dense(void) {
    enum { N = 50 };
    float w[N], g[N], u[N];
    double wr[N], ur[N], gr[N], got[N];
    fl_rng r;
    fl_rng_init(&r, 3, 0);
    for (int mode = 0; mode < 3; mode++) { /* 0 no velocity, 1 velocity, 2 Nesterov velocity */
        fill(&r, w, N, 1);
        fill(&r, g, N, 1);
        fill(&r, u, N, 1);
        for (int i = 0; i < N; i++)
            wr[i] = w[i], gr[i] = g[i], ur[i] = u[i];
        dgc_apply_dense(N, w, g, mode ? u : NULL, 0.1, 0.5, 0.9, mode == 2, 1e-2);
        for (int i = 0; i < N; i++) {
            double d = gr[i] * 0.5 + 1e-2 * wr[i], st = d;
            if (mode) {
                ur[i] = 0.9 * ur[i] + d;
                st = mode == 2 ? d + 0.9 * ur[i] : ur[i];
            }
            wr[i] -= 0.1 * st;
            got[i] = w[i];
            CHECK(g[i] == 0);
        }
        CHECK_CLOSE("apply_dense w", got, wr, N, 1e-6, 1e-6);
    }
}

/* N ranks at sparsity 0 without masking: every entry of v is sent every step, and the sum over
 * ranks divided by N is the dense Momentum step on the averaged gradient plus decay. */
static void test_equals_dense(void) {
    enum { N = 3, M = 300, STEPS = 10 };
    static float w[M], g[N][M], u[N][M], v[N][M], scratch[M + 4096];
    static int32_t idx[M];
    static dgc_pair pairs[N * M];
    static double wr[M], vel[M], got[M];
    fl_rng r;
    fl_rng_init(&r, 17, 0);
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        fill(&r, w, M, 1);
        memset(u, 0, sizeof u);
        memset(v, 0, sizeof v);
        for (int i = 0; i < M; i++)
            wr[i] = w[i], vel[i] = 0;
        const double lr = 0.05, m = 0.9, lambda = 1e-3;
        dgc_accum_args a = {.clip_scale = 1, .decay = lambda, .momentum = m,
                            .nesterov = nesterov, .correction = true};
        const int64_t start[] = {0, M};
        float *wseg[] = {w};
        for (int step = 0; step < STEPS; step++) {
            int64_t total = 0;
            for (int k = 0; k < N; k++)
                fill(&r, g[k], M, 1);
            for (int i = 0; i < M; i++) { /* dense Momentum on the average, in double */
                double d = lambda * wr[i];
                for (int k = 0; k < N; k++)
                    d += (double)g[k][i] / N;
                vel[i] = m * vel[i] + d;
                wr[i] -= lr * (nesterov ? d + m * vel[i] : vel[i]);
            }
            for (int k = 0; k < N; k++) {
                dgc_accumulate(M, g[k], w, u[k], v[k], &a);
                int64_t cnt = dgc_select_exact(M, v[k], dgc_k(M, 0), idx, scratch);
                dgc_encode(idx, cnt, 0, v[k], NULL, pairs + total);
                total += cnt;
            }
            CHECK(dgc_check_pairs(pairs, total, M) == -1);
            dgc_apply_pairs(pairs, total, 1, start, wseg, lr / N);
        }
        for (int i = 0; i < M; i++)
            got[i] = w[i];
        CHECK_CLOSE(nesterov ? "sparsity 0 vs dense Nesterov" : "sparsity 0 vs dense Momentum",
                    got, wr, M, 1e-5, 1e-5);
    }
}

/* --- the strategy on a job of one: state names, and its values restore training exactly --- */

typedef struct {
    fl_fleet      *fleet;
    fl_net        *net;
    fl_optim      *opt;
    fl_dist_optim *d;
} job;

static int job_create(job *j, const fl_strategy *s, double clip_norm) {
    memset(j, 0, sizeof *j);
    const int64_t hidden[] = {256, 96}, in_shape[] = {32};
    if (fl_fleet_init(NULL, &j->fleet) < 0)
        return -1;
    j->net = fl_model_mlp(FL_DTYPE_F32, 32, hidden, 2, FL_ACT_TANH, 4);
    if (!j->net || fl_net_build(j->net, 1, in_shape, 16, 3) < 0)
        return -1;
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-3,
                          .clip_norm = clip_norm};
    j->opt = fl_optim_create(&oc, fl_net_param(j->net, 0), fl_net_num_params(j->net),
                             FL_DTYPE_F32, fl_net_backend(j->net));
    if (!j->opt)
        return -1;
    j->d = fl_distributed_optimizer(j->fleet, j->net, j->opt, s);
    return j->d ? 0 : -1;
}

static void job_free(job *j) {
    fl_dist_optim_free(j->d);
    fl_optim_free(j->opt);
    fl_net_free(j->net);
    fl_fleet_free(j->fleet);
}

static int job_steps(job *j, int64_t from, int64_t count) {
    float x[16 * 32], probs[16 * 4];
    int32_t y[16];
    int64_t xs[] = {16, 32};
    for (int64_t s = from; s < from + count; s++) {
        fl_rng r;
        fl_rng_init(&r, 1000 + (uint64_t)s, 0);
        for (int i = 0; i < 16 * 32; i++)
            x[i] = (float)fl_rng_normal(&r);
        for (int i = 0; i < 16; i++)
            y[i] = (int32_t)fl_rng_below(&r, 4);
        fl_tensor xt, pt;
        const fl_tensor *logits;
        double cost;
        fl_tensor_view(&xt, FL_DTYPE_F32, 2, xs, x);
        FL_TRY(fl_net_forward(j->net, &xt, true, &logits));
        fl_tensor_view(&pt, FL_DTYPE_F32, 2, logits->shape, probs);
        FL_TRY(fl_softmax_xent_forward(fl_net_backend(j->net), logits, y, &pt, &cost));
        FL_TRY(fl_softmax_xent_backward(fl_net_backend(j->net), &pt, y, &pt));
        FL_TRY(fl_dist_minimize(j->d, &pt, 0.1, NULL));
    }
    return 0;
}

/* Every value a checkpoint holds: parameters, optimizer state, the distributed state. */
static size_t snapshot(job *j, char *buf, bool restore) {
    size_t off = 0;
    fl_param *all[64];
    int n = 0;
    for (int i = 0; i < fl_net_num_params(j->net); i++)
        all[n++] = fl_net_param(j->net, i);
    for (int i = 0; i < fl_optim_num_state(j->opt); i++)
        all[n++] = fl_optim_state(j->opt, i);
    for (int i = 0; i < fl_dist_num_state(j->d); i++)
        all[n++] = fl_dist_state(j->d, i);
    for (int i = 0; i < n; i++) {
        size_t b = fl_tensor_nbytes(&all[i]->value);
        if (buf && restore)
            memcpy(all[i]->value.data, buf + off, b);
        else if (buf)
            memcpy(buf + off, all[i]->value.data, b);
        off += b;
    }
    return off;
}

static void test_state(void) {
    fl_strategy s;
    fl_strategy_defaults(&s);
    s.dgc = true;
    s.dgc_configs.rampup_begin_step = 3;
    s.dgc_configs.rampup_step = 8;
    s.dgc_configs.sparsity.n = 2;
    s.dgc_configs.sparsity.v[0] = 0.9;
    s.dgc_configs.sparsity.v[1] = 0.99;
    job j;
    if (job_create(&j, &s, 0) < 0) {
        fprintf(stderr, "test_state: %s\n", fl_errmsg());
        test_failures++;
        job_free(&j);
        return;
    }
    /* fc1.weight (256 x 32 = 8192) stays dense; fc2.weight (96 x 256 = 24576) is compressed */
    CHECK(fl_dist_num_state(j.d) == 3);
    CHECK(strcmp(fl_dist_state(j.d, 0)->name, "dist.counters") == 0);
    fl_param *u = fl_dist_state(j.d, 1), *v = fl_dist_state(j.d, 2);
    fl_param *big = NULL;
    for (int i = 0; i < fl_net_num_params(j.net); i++)
        if (fl_net_param(j.net, i)->value.numel >= 16384)
            big = fl_net_param(j.net, i);
    CHECK(big && u && v && fl_dist_state(j.d, 3) == NULL);
    if (!big || !u || !v)
        goto done;
    char want[128];
    snprintf(want, sizeof want, "dgc.u.%s", big->name);
    CHECK(strcmp(u->name, want) == 0);
    snprintf(want, sizeof want, "dgc.v.%s", big->name);
    CHECK(strcmp(v->name, want) == 0);
    CHECK(u->value.numel == big->value.numel && u->value.dtype == FL_DTYPE_F32 && !u->trainable);

    /* 6 steps (3 dense, 3 compressed), snapshot, 6 more: A; restore, the same 6 again: B */
    size_t bytes = snapshot(&j, NULL, false);
    char *saved = malloc(bytes), *a = malloc(bytes), *b = malloc(bytes);
    CHECK_OK(job_steps(&j, 0, 6));
    int64_t nz = 0;
    for (int64_t i = 0; i < v->value.numel; i++)
        nz += ((float *)v->value.data)[i] != 0;
    CHECK(nz > 0); /* the accumulator holds what was not sent */
    snapshot(&j, saved, false);
    CHECK_OK(job_steps(&j, 6, 6));
    snapshot(&j, a, false);
    snapshot(&j, saved, true);
    CHECK(fl_dist_step(j.d) == 6);
    CHECK_OK(job_steps(&j, 6, 6));
    snapshot(&j, b, false);
    CHECK(memcmp(a, b, bytes) == 0);
    free(saved);
    free(a);
    free(b);
done:
    job_free(&j);
}

/* Local clipping on a job of one (threshold clip_norm * 1^(-1/2)): DGC at sparsity 0 without
 * masking is dense Momentum with the same clipping; with local_clipping off it does not clip. */
static void test_local_clipping(void) {
    fl_strategy dense, dgc;
    fl_strategy_defaults(&dense);
    fl_strategy_defaults(&dgc);
    dgc.dgc = true;
    dgc.dgc_configs.sparsity.v[0] = 0;
    dgc.dgc_configs.momentum_masking = false;
    dgc.dgc_configs.dense_fallback = false;
    dgc.dgc_configs.min_compress_numel = 4096;
    float *p[3] = {NULL, NULL, NULL};
    int64_t count = 0;
    for (int run = 0; run < 3; run++) { /* dense clipped, DGC clipped, DGC local clipping off */
        job j;
        if (run == 2)
            dgc.dgc_configs.local_clipping = false;
        if (job_create(&j, run ? &dgc : &dense, 0.05) < 0) {
            fprintf(stderr, "test_local_clipping: %s\n", fl_errmsg());
            test_failures++;
            job_free(&j);
            break;
        }
        CHECK_OK(job_steps(&j, 0, 5));
        count = fl_net_numel(j.net);
        p[run] = malloc((size_t)count * sizeof(float));
        memcpy(p[run], fl_net_flat_params(j.net), (size_t)count * sizeof(float));
        job_free(&j);
    }
    if (p[0] && p[1] && p[2]) {
        CHECK_CLOSE_F32("DGC sparsity 0 clipped vs dense clipped", p[1], p[0], count, 1e-6, 1e-5);
        double maxd = 0;
        for (int64_t i = 0; i < count; i++)
            maxd = fmax(maxd, fabs((double)p[2][i] - (double)p[0][i]));
        CHECK(maxd > 1e-3); /* the gradient norm is far above 0.05: clipping mattered */
    }
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

int main(void) {
    test_schedule();
    test_k_and_rules();
    test_accumulate();
    test_select();
    test_accumulate_select();
    test_encode();
    test_scatter_apply();
    test_apply_dense();
    test_equals_dense();
    test_state();
    test_local_clipping();
    TEST_DONE();
}
