/* test_dgc_batch.c - DGC's batched accumulation, selection and encoding (fl_backend_dgc_batch)
 * against the same work tensor by tensor (dgc_accumulate_select, dgc_encode) on the same
 * backend: counts, hints, pairs, u and v bit for bit, over tensors of 0 to 300000 values with k
 * of 0, 1, beyond n, DGC's 0.99 and 0.999, magnitudes with many ties, u masked and not, two
 * steps. The cpu table has no batched entry (the per-tensor fallback); the cuda table's, which
 * does every tensor in the same launches, is checked where a GPU is bound. */
#include "fleet/backend.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NT 8
static const int64_t sizes[NT] = {0, 1, 100, 5000, 20000, 70000, 300000, 65536};

static int64_t k_of(int i, int64_t n) {
    switch (i) {
    case 1: return 3; /* beyond n */
    case 2: return 0;
    case 3: return 1;
    case 5: return n / 100; /* 0.99 */
    default: return n / 1000 + 1; /* about 0.999 */
    }
}

static void *dev(const fl_backend *be, const void *h, size_t bytes) {
    void *d = be->alloc(bytes ? bytes : 4);
    FL_ASSERT(d);
    if (bytes)
        be->copy(d, h, bytes, FL_COPY_H2D, NULL);
    return d;
}

static void *host(const fl_backend *be, const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 4);
    FL_ASSERT(h);
    if (bytes)
        be->copy(h, d, bytes, FL_COPY_D2H, NULL);
    be->stream_sync(NULL);
    return h;
}

static void same(const char *what, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes)) {
        fprintf(stderr, "dgc batch: %s differs\n", what);
        test_failures++;
    }
}

static void check_backend(const fl_backend *be, bool mask_u, bool nesterov) {
    fl_rng r;
    fl_rng_init(&r, 7, (uint64_t)mask_u * 2 + nesterov);
    fl_dgc_accum_args a = {.clip_scale = 0.5, .decay = 1e-3, .momentum = 0.9,
                           .nesterov = nesterov, .correction = true};
    float *gv[2][NT], *gu[2][NT], *gg[NT], *gw[NT];
    fl_dgc_pair *gp[2][NT];
    float hint[2][NT] = {{0}};
    int64_t most = 1, base = 0;
    fl_dgc_batch_item items[2][NT];
    for (int i = 0; i < NT; i++) {
        int64_t n = sizes[i], k = k_of(i, n);
        size_t fb = (size_t)n * sizeof(float);
        float *h = malloc(fb ? fb : 4);
        for (int64_t j = 0; j < n; j++) /* tensor 7: magnitudes from 4 values, many ties */
            h[j] = i == 7 ? (float)((int64_t)fl_rng_below(&r, 4) - 2) * 0.25f
                          : (float)(fl_rng_uniform_f64(&r) * 2 - 1);
        gw[i] = dev(be, h, fb);
        for (int c = 0; c < 2; c++) {
            gv[c][i] = dev(be, h, fb);
            gu[c][i] = dev(be, h, fb);
            gp[c][i] = be->alloc((size_t)(k > 0 ? k : 1) * sizeof(fl_dgc_pair));
            items[c][i] = (fl_dgc_batch_item){.n = n, .k = k, .base = base, .grad = NULL,
                                              .w = gw[i], .u = gu[c][i], .v = gv[c][i],
                                              .pairs = gp[c][i], .seed = (uint64_t)i,
                                              .hint = &hint[c][i]};
        }
        gg[i] = be->alloc(fb ? fb : 4);
        most = n > most ? n : most;
        base += n;
        free(h);
    }
    int32_t *idx = be->alloc((size_t)most * sizeof(int32_t));
    float *scratch = be->alloc(((size_t)most + (size_t)(most / 100 + 4096)) * sizeof(float));
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < NT; i++) { /* this step's gradients, the same for both */
            size_t fb = (size_t)sizes[i] * sizeof(float);
            float *g = malloc(fb ? fb : 4);
            for (int64_t j = 0; j < sizes[i]; j++)
                g[j] = (float)(fl_rng_uniform_f64(&r) * 2 - 1);
            if (fb)
                be->copy(gg[i], g, fb, FL_COPY_H2D, NULL);
            items[0][i].grad = items[1][i].grad = gg[i];
            free(g);
        }
        int64_t cnt[2][NT];
        fl_backend_dgc_batch(be, NT, items[0], &a, mask_u, cnt[0], idx, scratch);
        for (int i = 0; i < NT; i++) {
            const fl_dgc_batch_item *t = &items[1][i];
            cnt[1][i] = be->dgc_accumulate_select(t->n, t->grad, t->w, t->u, t->v, &a, t->k, idx,
                                                  scratch, t->seed, t->hint, NULL);
            be->dgc_encode(idx, cnt[1][i], t->base, t->v, mask_u ? t->u : NULL, t->pairs);
        }
        for (int i = 0; i < NT; i++) {
            char what[160];
            snprintf(what, sizeof what, "%s, tensor %d (n %lld, k %lld), step %d%s%s", be->name,
                     i, (long long)sizes[i], (long long)k_of(i, sizes[i]), step,
                     mask_u ? ", u masked" : "", nesterov ? ", nesterov" : "");
            CHECK(cnt[0][i] == cnt[1][i]);
            CHECK(cnt[0][i] <= (k_of(i, sizes[i]) < sizes[i] ? k_of(i, sizes[i]) : sizes[i]));
            CHECK(sizes[i] < 100 || cnt[0][i] == k_of(i, sizes[i])); /* never short here */
            same(what, &hint[0][i], &hint[1][i], sizeof(float));
            size_t pb = (size_t)(cnt[0][i] > 0 ? cnt[0][i] : 0) * sizeof(fl_dgc_pair);
            size_t fb = (size_t)sizes[i] * sizeof(float);
            void *p0 = host(be, gp[0][i], pb), *p1 = host(be, gp[1][i], pb);
            void *v0 = host(be, gv[0][i], fb), *v1 = host(be, gv[1][i], fb);
            void *u0 = host(be, gu[0][i], fb), *u1 = host(be, gu[1][i], fb);
            same(what, p0, p1, pb);
            same(what, v0, v1, fb);
            same(what, u0, u1, fb);
            for (int64_t j = 0; j < cnt[0][i]; j++) { /* each pair's index in its tensor */
                const fl_dgc_pair *q = (const fl_dgc_pair *)p0 + j;
                CHECK(q->index >= items[0][i].base && q->index < items[0][i].base + sizes[i]);
            }
            free(p0), free(p1), free(v0), free(v1), free(u0), free(u1);
        }
    }
    for (int i = 0; i < NT; i++) {
        be->free(gw[i]), be->free(gg[i]);
        for (int c = 0; c < 2; c++)
            be->free(gv[c][i]), be->free(gu[c][i]), be->free(gp[c][i]);
    }
    be->free(idx), be->free(scratch);
}

int main(void) {
    for (int m = 0; m < 4; m++)
        check_backend(fl_backend_cpu(), m & 1, m & 2);
    const fl_backend *g = fl_backend_cuda();
    if (!g || g->device_bind(0) != FL_OK) {
        if (test_failures == 0)
            fprintf(stderr, "test_dgc_batch: cpu checked; the cuda table skipped (no GPU)\n");
        TEST_DONE();
    }
    for (int m = 0; m < 4; m++)
        check_backend(g, m & 1, m & 2);
    TEST_DONE();
}
