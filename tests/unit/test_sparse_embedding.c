/* test_sparse_embedding.c - the sparse embedding: the lookup's distinct ids (ascending, whatever
 * the batch's order) and positions; forward against a small dense table indexed directly, sum
 * and mean, with empty bags, ids repeated in a bag and shared across samples, chosen slots and a
 * wider output stride; backward against the dense table's gradient and against finite
 * differences in f64; the same bits at 1 and 2 threads; errors that name what is wrong. */
#include "fleet/ctr.h"
#include "fleet/rng.h"
#include "fleet/sparse.h"
#include "fleet/status.h"
#include "test.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { NSLOTS = 3, VOCAB = 5, DIM = 4, B = 5 };

/* The dense reference: row (slot, value) of a table indexed directly. */
static double dense_table[NSLOTS][VOCAB][DIM];

static uint64_t id_of(int s, int v) { return fl_ctr_id(s, (uint64_t)v * 977 + 13); }

static void id_parts(uint64_t id, int *s, int *v) {
    *s = fl_ctr_id_slot(id);
    *v = (int)(((id & FL_CTR_HASH_MASK) - 13) / 977);
}

/* Bags (per sample, slot): values; -1 ends a bag. Sample 1's slot 2 and sample 3's slot 0 are
 * empty; sample 0's slot 0 repeats value 1; value 1 of slot 0 is shared by samples 0, 2, 4. */
static const int bags[B][NSLOTS][4] = {
    {{1, 1, 3, -1}, {0, -1}, {4, 2, -1}},
    {{2, -1}, {0, 4, -1}, {-1}},
    {{1, -1}, {3, 3, 3, -1}, {0, -1}},
    {{-1}, {1, -1}, {2, 0, 4, -1}},
    {{4, 1, -1}, {0, -1}, {3, -1}},
};

/* The batch of `bags`; reversed: each bag's ids in the opposite order (the lookup's ids must not
 * change). */
static void make_batch(fl_ctr_batch *b, bool reversed) {
    CHECK_OK(fl_ctr_batch_init(b, 1, NSLOTS, B, 8));
    for (int i = 0; i < B; i++) {
        uint64_t ids[16];
        int32_t counts[NSLOTS];
        int n = 0;
        for (int s = 0; s < NSLOTS; s++) {
            int c = 0;
            while (bags[i][s][c] >= 0)
                c++;
            for (int q = 0; q < c; q++)
                ids[n + q] = id_of(s, bags[i][s][reversed ? c - 1 - q : q]);
            counts[s] = c;
            n += c;
        }
        float dense = (float)i;
        CHECK_OK(fl_ctr_batch_add(b, i % 2, &dense, ids, counts));
    }
}

/* Fills r->rows from the dense table. */
static void fill_rows(fl_sparse_rows *r) {
    for (int64_t k = 0; k < r->n; k++) {
        int s, v;
        id_parts(r->ids[k], &s, &v);
        for (int c = 0; c < r->dim; c++)
            r->rows[k * r->dim + c] = (float)dense_table[s][v][c];
    }
}

/* The forward by the definition over the dense table: out (B, nsel * DIM) at stride ld. */
static void ref_forward(const fl_ctr_batch *b, const int *slots, int nsel, bool mean,
                        double *out, int64_t ld) {
    for (int64_t i = 0; i < b->batch; i++)
        for (int j = 0; j < nsel; j++) {
            int64_t n;
            const uint64_t *ids = fl_ctr_bag(b, i, slots[j], &n);
            for (int c = 0; c < DIM; c++) {
                double sum = 0;
                for (int64_t q = 0; q < n; q++) {
                    int s, v;
                    id_parts(ids[q], &s, &v);
                    sum += (double)(float)dense_table[s][v][c];
                }
                out[i * ld + j * DIM + c] = mean && n > 0 ? sum / (double)n : sum;
            }
        }
}

/* The dense table's gradient for dout, by the definition. */
static void ref_backward(const fl_ctr_batch *b, const int *slots, int nsel, bool mean,
                         const double *dout, int64_t ld, double grad[NSLOTS][VOCAB][DIM]) {
    memset(grad, 0, sizeof(double) * NSLOTS * VOCAB * DIM);
    for (int64_t i = 0; i < b->batch; i++)
        for (int j = 0; j < nsel; j++) {
            int64_t n;
            const uint64_t *ids = fl_ctr_bag(b, i, slots[j], &n);
            for (int64_t q = 0; q < n; q++) {
                int s, v;
                id_parts(ids[q], &s, &v);
                for (int c = 0; c < DIM; c++)
                    grad[s][v][c] += dout[i * ld + j * DIM + c] / (mean ? (double)n : 1.0);
            }
        }
}

static void test_lookup(void) {
    fl_ctr_batch b, rev;
    make_batch(&b, false);
    make_batch(&rev, true);
    fl_sparse_lookup lk = {0}, lr = {0};
    CHECK_OK(fl_sparse_lookup_collect(&lk, &b, NULL, 0));
    CHECK_OK(fl_sparse_lookup_collect(&lr, &rev, NULL, 0));
    CHECK(lk.batch == B && lk.nslots == NSLOTS);
    CHECK(lk.nocc == fl_ctr_batch_nids(&b));
    /* distinct values per slot: slot 0 {1, 3, 2, 4} slot 1 {0, 4, 3, 1} slot 2 {4, 2, 0, 3} */
    CHECK(lk.n == 12);
    for (int64_t r = 1; r < lk.n; r++)
        CHECK(lk.ids[r - 1] < lk.ids[r]);
    CHECK(lr.n == lk.n && !memcmp(lr.ids, lk.ids, (size_t)lk.n * sizeof *lk.ids));
    /* every occurrence points at its id; the transpose lists each occurrence's bag once */
    int64_t seen = 0;
    for (int64_t k = 0; k < B * NSLOTS; k++) {
        int64_t n;
        const uint64_t *ids = fl_ctr_bag(&b, k / NSLOTS, (int)(k % NSLOTS), &n);
        CHECK(lk.offsets[k + 1] - lk.offsets[k] == n);
        for (int64_t q = 0; q < n; q++)
            CHECK(lk.ids[lk.index[lk.offsets[k] + q]] == ids[q]);
    }
    for (int64_t r = 0; r < lk.n; r++)
        for (int64_t q = lk.row_start[r]; q < lk.row_start[r + 1]; q++, seen++) {
            int32_t k = lk.occ_bag[q];
            CHECK(q == lk.row_start[r] || lk.occ_bag[q - 1] <= k); /* ascending */
            int hits = 0;
            for (int64_t o = lk.offsets[k]; o < lk.offsets[k + 1]; o++)
                hits += lk.index[o] == r;
            CHECK(hits > 0);
        }
    CHECK(seen == lk.nocc);
    /* the life cycle's counts: an id's occurrences, and the labels of their samples summed */
    int32_t labels[B];
    for (int i = 0; i < B; i++)
        labels[i] = i % 2;
    float shows[64], clicks[64], no_clicks[64];
    CHECK(lk.n <= 64);
    fl_sparse_lookup_counts(&lk, labels, shows, clicks);
    fl_sparse_lookup_counts(&lk, NULL, shows, no_clicks);
    for (int64_t r = 0; r < lk.n; r++) {
        double want_show = 0, want_click = 0;
        for (int i = 0; i < B; i++)
            for (int j = 0; j < NSLOTS; j++) {
                int64_t n;
                const uint64_t *ids = fl_ctr_bag(&b, i, j, &n);
                for (int64_t q = 0; q < n; q++)
                    if (ids[q] == lk.ids[r]) {
                        want_show += 1;
                        want_click += labels[i];
                    }
            }
        CHECK(want_show > 0 && shows[r] == (float)want_show);
        CHECK(clicks[r] == (float)want_click && no_clicks[r] == 0);
    }
    /* chosen slots, in the order given: 2 then 0 */
    int sel[2] = {2, 0};
    CHECK_OK(fl_sparse_lookup_collect(&lk, &b, sel, 2));
    CHECK(lk.nslots == 2 && lk.n == 8);
    for (int64_t r = 0; r < lk.n; r++)
        CHECK(fl_ctr_id_slot(lk.ids[r]) == 0 || fl_ctr_id_slot(lk.ids[r]) == 2);
    /* a slot out of range is named */
    int bad[2] = {0, 3};
    CHECK_RC(fl_sparse_lookup_collect(&lk, &b, bad, 2), FL_EINVAL);
    CHECK_MSG("chosen slot 3 (entry 1)");
    /* an empty batch */
    fl_ctr_batch empty;
    CHECK_OK(fl_ctr_batch_init(&empty, 1, NSLOTS, 1, 1));
    CHECK_OK(fl_sparse_lookup_collect(&lk, &empty, NULL, 0));
    CHECK(lk.n == 0 && lk.nocc == 0 && lk.batch == 0);
    fl_sparse_rows r = {0};
    CHECK_OK(fl_sparse_rows_prepare(&r, DIM, &lk));
    CHECK_OK(fl_sparse_embedding_forward(&lk, &r, FL_SPARSE_SUM, FL_DTYPE_F32, NULL, 0));
    CHECK_OK(fl_sparse_embedding_backward(&lk, &r, FL_SPARSE_SUM, FL_DTYPE_F32, NULL, 0));
    fl_sparse_rows_free(&r);
    fl_ctr_batch_free(&empty);
    fl_sparse_lookup_free(&lk);
    fl_sparse_lookup_free(&lr);
    fl_ctr_batch_free(&b);
    fl_ctr_batch_free(&rev);
}

/* Forward and backward of chosen slots (NULL: all) against the dense table, f32 and f64, at
 * stride ld (0: dense), and backward against finite differences of L = sum(out * w). */
static void test_against_dense(const int *slots_in, int nsel, fl_sparse_pool pool, int64_t ld) {
    int all[NSLOTS] = {0, 1, 2};
    const int *slots = slots_in ? slots_in : all;
    bool mean = pool == FL_SPARSE_MEAN;
    fl_ctr_batch b;
    make_batch(&b, false);
    fl_sparse_lookup lk = {0};
    CHECK_OK(fl_sparse_lookup_collect(&lk, &b, slots_in, nsel));
    fl_sparse_rows r = {0};
    CHECK_OK(fl_sparse_rows_prepare(&r, DIM, &lk));
    fill_rows(&r);
    int64_t width = (int64_t)nsel * DIM, stride = ld ? ld : width;
    size_t cells = (size_t)(B * stride);
    double *want = calloc(cells, sizeof *want), *got64 = calloc(cells, sizeof *got64);
    double *got32 = calloc(cells, sizeof *got32), *w = calloc(cells, sizeof *w);
    float *out32 = calloc(cells, sizeof *out32);
    /* columns beyond the embedding's are left alone */
    for (size_t q = 0; q < cells; q++)
        got64[q] = out32[q] = 7.0f;
    ref_forward(&b, slots, nsel, mean, want, stride);
    CHECK_OK(fl_sparse_embedding_forward(&lk, &r, pool, FL_DTYPE_F64, got64, ld));
    CHECK_OK(fl_sparse_embedding_forward(&lk, &r, pool, FL_DTYPE_F32, out32, ld));
    for (int64_t i = 0; i < B; i++)
        for (int64_t c = 0; c < stride; c++) {
            size_t q = (size_t)(i * stride + c);
            if (c >= width) {
                CHECK(got64[q] == 7.0 && out32[q] == 7.0f);
                want[q] = got64[q] = 7.0;
            }
            got32[q] = out32[q];
        }
    CHECK_CLOSE("forward f64", got64, want, cells, 1e-12, 1e-12);
    CHECK_CLOSE("forward f32", got32, want, cells, 1e-6, 1e-6);

    /* backward: against the dense table's gradient */
    fl_rng rng;
    fl_rng_init(&rng, 11, (uint64_t)pool);
    for (size_t q = 0; q < cells; q++)
        w[q] = 2.0 * fl_rng_uniform_f64(&rng) - 1.0;
    double gref[NSLOTS][VOCAB][DIM];
    ref_backward(&b, slots, nsel, mean, w, stride, gref);
    CHECK_OK(fl_sparse_embedding_backward(&lk, &r, pool, FL_DTYPE_F64, w, ld));
    size_t ng = r.n > 0 ? (size_t)r.n * DIM : 1;
    double *g = calloc(ng, sizeof *g), *gw = calloc(ng, sizeof *gw);
    for (int64_t k = 0; k < r.n; k++) {
        int s, v;
        id_parts(r.ids[k], &s, &v);
        for (int c = 0; c < DIM; c++) {
            g[k * DIM + c] = r.grads[k * DIM + c];
            gw[k * DIM + c] = gref[s][v][c];
        }
    }
    CHECK_CLOSE("backward vs dense table", g, gw, r.n * DIM, 1e-6, 1e-6);
    /* every touched row got its gradient, and only rows of the batch are there */
    CHECK(r.n == lk.n);

    /* finite differences of L = sum(out * w) in f64 (L is linear in the rows: central
     * differences are exact up to rounding) */
    double *fd = calloc(ng, sizeof *fd);
    for (int64_t q = 0; q < r.n * DIM; q++) {
        float keep = r.rows[q];
        double lp = 0, lm = 0;
        float hp = keep + 0.01f, hm = keep - 0.01f;
        r.rows[q] = hp;
        CHECK_OK(fl_sparse_embedding_forward(&lk, &r, pool, FL_DTYPE_F64, got64, ld));
        for (int64_t i = 0; i < B; i++)
            for (int64_t c = 0; c < width; c++)
                lp += got64[i * stride + c] * w[i * stride + c];
        r.rows[q] = hm;
        CHECK_OK(fl_sparse_embedding_forward(&lk, &r, pool, FL_DTYPE_F64, got64, ld));
        for (int64_t i = 0; i < B; i++)
            for (int64_t c = 0; c < width; c++)
                lm += got64[i * stride + c] * w[i * stride + c];
        r.rows[q] = keep;
        fd[q] = (lp - lm) / ((double)hp - (double)hm);
    }
    CHECK_CLOSE("backward vs finite differences", g, fd, r.n * DIM, 1e-6, 1e-5);
    free(fd);
    free(g);
    free(gw);
    free(want);
    free(got64);
    free(got32);
    free(out32);
    free(w);
    fl_sparse_rows_free(&r);
    fl_sparse_lookup_free(&lk);
    fl_ctr_batch_free(&b);
}

/* An empty bag pools to zeros under mean as under sum (not 0/0). */
static void test_empty_bags(void) {
    fl_ctr_batch b;
    make_batch(&b, false);
    fl_sparse_lookup lk = {0};
    fl_sparse_rows r = {0};
    CHECK_OK(fl_sparse_lookup_collect(&lk, &b, NULL, 0));
    CHECK_OK(fl_sparse_rows_prepare(&r, DIM, &lk));
    fill_rows(&r);
    float out[B * NSLOTS * DIM];
    for (int pool = 0; pool < 2; pool++) {
        CHECK_OK(fl_sparse_embedding_forward(&lk, &r, (fl_sparse_pool)pool, FL_DTYPE_F32, out, 0));
        for (int c = 0; c < DIM; c++) {
            CHECK(out[(1 * NSLOTS + 2) * DIM + c] == 0.0f); /* sample 1, slot 2 */
            CHECK(out[(3 * NSLOTS + 0) * DIM + c] == 0.0f); /* sample 3, slot 0 */
        }
    }
    fl_sparse_rows_free(&r);
    fl_sparse_lookup_free(&lk);
    fl_ctr_batch_free(&b);
}

/* Rows that are not the lookup's, a short stride, a bad type: refused, named. */
static void test_errors(void) {
    fl_ctr_batch b;
    make_batch(&b, false);
    fl_sparse_lookup lk = {0}, other = {0};
    fl_sparse_rows r = {0};
    int sel[1] = {1};
    CHECK_OK(fl_sparse_lookup_collect(&lk, &b, NULL, 0));
    CHECK_OK(fl_sparse_lookup_collect(&other, &b, sel, 1));
    CHECK_OK(fl_sparse_rows_prepare(&r, DIM, &other));
    fill_rows(&r);
    float out[B * NSLOTS * DIM];
    CHECK_RC(fl_sparse_embedding_forward(&lk, &r, FL_SPARSE_SUM, FL_DTYPE_F32, out, 0),
             FL_EINVAL);
    CHECK_MSG("rows for a lookup of");
    CHECK_OK(fl_sparse_rows_prepare(&r, DIM, &lk));
    r.ids[0] ^= 1;
    CHECK_RC(fl_sparse_embedding_backward(&lk, &r, FL_SPARSE_SUM, FL_DTYPE_F32, out, 0),
             FL_EINVAL);
    CHECK_MSG("other ids");
    r.ids[0] ^= 1;
    CHECK_RC(fl_sparse_embedding_forward(&lk, &r, FL_SPARSE_SUM, FL_DTYPE_F32, out, 5),
             FL_EINVAL);
    CHECK_MSG("stride 5");
    CHECK_RC(fl_sparse_embedding_forward(&lk, &r, FL_SPARSE_SUM, FL_DTYPE_I32, out, 0),
             FL_EINVAL);
    CHECK_RC(fl_sparse_rows_prepare(&r, 0, &lk), FL_EINVAL);
    fl_sparse_pool p;
    CHECK_OK(fl_sparse_pool_parse("mean", &p));
    CHECK(p == FL_SPARSE_MEAN && !strcmp(fl_sparse_pool_name(p), "mean"));
    CHECK_RC(fl_sparse_pool_parse("max", &p), FL_EINVAL);
    CHECK_MSG("'max'");
    fl_sparse_rows_free(&r);
    fl_sparse_lookup_free(&lk);
    fl_sparse_lookup_free(&other);
    fl_ctr_batch_free(&b);
}

/* A ctr_synth batch large enough for the parallel paths: forward and backward give the same
 * bits at 1 and 2 threads, and the lookup does not depend on them either. */
static void test_threads(void) {
    fl_ctr_synth_config sc = fl_ctr_synth_config_default();
    sc.vocab = 1000;
    sc.max_ids = 3;
    fl_ctr_synth *syn = fl_ctr_synth_create(&sc);
    CHECK(syn != NULL);
    if (!syn)
        return;
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, sc.ndense, sc.nslots, 512, 512 * 26 * 2));
    CHECK_OK(fl_ctr_synth_batch(syn, 3, 0, 1, 512, &b));
    enum { D = 8 };
    fl_sparse_lookup lk = {0};
    fl_sparse_rows r = {0};
    CHECK_OK(fl_sparse_lookup_collect(&lk, &b, NULL, 0));
    CHECK(lk.nocc * D >= 32768); /* the parallel path */
    CHECK(lk.n < lk.nocc);       /* Zipf: ids repeat across samples */
    CHECK_OK(fl_sparse_rows_prepare(&r, D, &lk));
    fl_rng rng;
    fl_rng_init(&rng, 5, 0);
    for (int64_t q = 0; q < r.n * D; q++)
        r.rows[q] = fl_rng_uniform(&rng) - 0.5f;
    int64_t cells = b.batch * sc.nslots * D;
    float *out[2], *grads[2], *dout = malloc((size_t)cells * sizeof *dout);
    for (int64_t q = 0; q < cells; q++)
        dout[q] = fl_rng_uniform(&rng) - 0.5f;
    for (int pool = 0; pool < 2; pool++) {
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            out[t] = malloc((size_t)cells * sizeof **out);
            grads[t] = malloc((r.n > 0 ? (size_t)r.n * D : 1) * sizeof **grads);
            CHECK_OK(fl_sparse_embedding_forward(&lk, &r, (fl_sparse_pool)pool, FL_DTYPE_F32,
                                                 out[t], 0));
            CHECK_OK(fl_sparse_embedding_backward(&lk, &r, (fl_sparse_pool)pool, FL_DTYPE_F32,
                                                  dout, 0));
            memcpy(grads[t], r.grads, (size_t)(r.n * D) * sizeof *r.grads);
        }
        CHECK(!memcmp(out[0], out[1], (size_t)cells * sizeof **out));
        CHECK(!memcmp(grads[0], grads[1], (size_t)(r.n * D) * sizeof **grads));
        for (int t = 0; t < 2; t++) {
            free(out[t]);
            free(grads[t]);
        }
    }
    omp_set_num_threads(2);
    free(dout);
    fl_sparse_rows_free(&r);
    fl_sparse_lookup_free(&lk);
    fl_ctr_batch_free(&b);
    fl_ctr_synth_free(syn);
}

int main(void) {
    fl_rng rng;
    fl_rng_init(&rng, 7, 0);
    for (int s = 0; s < NSLOTS; s++)
        for (int v = 0; v < VOCAB; v++)
            for (int c = 0; c < DIM; c++)
                dense_table[s][v][c] = 2.0 * fl_rng_uniform_f64(&rng) - 1.0;
    test_lookup();
    int sel[2] = {2, 0};
    for (int pool = 0; pool < 2; pool++) {
        test_against_dense(NULL, NSLOTS, (fl_sparse_pool)pool, 0);
        test_against_dense(sel, 2, (fl_sparse_pool)pool, 0);
        test_against_dense(NULL, NSLOTS, (fl_sparse_pool)pool, NSLOTS * DIM + 3);
    }
    test_empty_bags();
    test_errors();
    test_threads();
    TEST_DONE();
}
