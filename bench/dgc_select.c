/* dgc_select.c - how long DGC's top-k selection takes on one thread (issue 5): exact
 * quickselect against the sampled threshold refined to the exact top k (src/strategy/
 * dgc_math.c), on tensors of 4M and 16M values at the sparsities of the warm-up schedule; the
 * per-element accumulation pass (momentum correction) that every step makes anyway, for scale;
 * and the fused accumulate + sampled select (both jobs in one pass), so that "fused -
 * accumulate" is what selection adds to a step; "hinted" is the fused pass given last step's
 * k-th value as its threshold hint, as the strategy runs it from the second step at a sparsity
 * (no sample drawn). The values are a DGC accumulator
 * after some steps: normal with a few heavy entries.
 * Prints the median of REPS runs per cell, in ms.
 *   build/bench/dgc_select [REPS (7)] [SIZES in M (4,16)] */
#include "fleet/rng.h"
#include "kernels/cpu/dgc_kernels.h"
#include "strategy/dgc_math.h"
#include "bench_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    const char *sizes_arg = argc > 2 ? argv[2] : "4,16";
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: dgc_select [REPS (1..1000)] [SIZES in M, e.g. 4,16]\n");
        return 2;
    }
    const double sparsities[] = {0.9, 0.99, 0.999};
    printf("# dgc_select: one thread, median of %d runs, ms\n", reps);
    printf("%10s %9s %9s %10s %10s %8s %12s %10s %10s\n", "numel", "sparsity", "k", "exact",
           "sampled", "passes", "accumulate", "fused", "hinted");
    char buf[64];
    snprintf(buf, sizeof buf, "%s", sizes_arg);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int64_t n = (int64_t)(atof(tok) * 1048576);
        if (n < 1) {
            fprintf(stderr, "dgc_select: bad size '%s'\n", tok);
            return 2;
        }
        float *v = malloc((size_t)n * sizeof *v), *u = malloc((size_t)n * sizeof *u);
        float *g = malloc((size_t)n * sizeof *g), *w = malloc((size_t)n * sizeof *w);
        float *scratch = malloc((size_t)(n + n / 100 + 4096) * sizeof *scratch);
        int32_t *idx = malloc((size_t)n * sizeof *idx);
        if (!v || !u || !g || !w || !scratch || !idx) {
            fprintf(stderr, "dgc_select: out of memory for %lld values\n", (long long)n);
            return 1;
        }
        fl_rng r;
        fl_rng_init(&r, 1, 0);
        for (int64_t i = 0; i < n; i++) {
            v[i] = (float)fl_rng_normal(&r);
            if (fl_rng_below(&r, 1000) == 0)
                v[i] *= 30; /* heavy entries, as an accumulator grows them */
            u[i] = w[i] = g[i] = 0;
        }
        double *te = malloc((size_t)reps * sizeof *te), *ts = malloc((size_t)reps * sizeof *ts);
        double *ta = malloc((size_t)reps * sizeof *ta), *tf = malloc((size_t)reps * sizeof *tf);
        double *th = malloc((size_t)reps * sizeof *th);
        dgc_accum_args a = {.clip_scale = 1, .momentum = 0.9, .correction = true};
        for (int rep = 0; rep < reps; rep++) {
            double t0 = 1e3 * bench_wall_s();
            dgc_accumulate(n, g, w, u, v, &a); /* g, w zero: v unchanged */
            ta[rep] = 1e3 * bench_wall_s() - t0;
        }
        double acc = bench_median(ta, reps);
        for (size_t si = 0; si < sizeof sparsities / sizeof sparsities[0]; si++) {
            int64_t k = dgc_k(n, sparsities[si]);
            int passes = 0;
            int64_t ce = 0, cs = 0;
            for (int rep = 0; rep < reps; rep++) {
                double t0 = 1e3 * bench_wall_s();
                ce = dgc_select_exact(n, v, k, idx, scratch);
                double t1 = 1e3 * bench_wall_s();
                cs = dgc_select_sampled(n, v, k, idx, scratch, (uint64_t)rep, &passes);
                double t2 = 1e3 * bench_wall_s();
                te[rep] = t1 - t0;
                ts[rep] = t2 - t1;
                /* g and w are zero: the accumulation leaves v as it is, run after run */
                int fp = 0;
                double t3 = 1e3 * bench_wall_s();
                int64_t cf = dgc_accumulate_select(n, g, w, u, v, &a, k, idx, scratch,
                                                   (uint64_t)rep, NULL, &fp);
                tf[rep] = 1e3 * bench_wall_s() - t3;
                float hint = 0; /* the first call finds it, the second uses it */
                dgc_accumulate_select(n, g, w, u, v, &a, k, idx, scratch, (uint64_t)rep, &hint,
                                      NULL);
                double t4 = 1e3 * bench_wall_s();
                int64_t ch = dgc_accumulate_select(n, g, w, u, v, &a, k, idx, scratch,
                                                   (uint64_t)rep, &hint, NULL);
                th[rep] = 1e3 * bench_wall_s() - t4;
                if (ch != k)
                    fprintf(stderr, "dgc_select: hinted selected %lld, want %lld\n",
                            (long long)ch, (long long)k);
                if (cf != k)
                    fprintf(stderr, "dgc_select: fused selected %lld, want %lld\n",
                            (long long)cf, (long long)k);
            }
            if (ce != k || cs != k)
                fprintf(stderr, "dgc_select: selected %lld (exact) and %lld (sampled), want %lld\n",
                        (long long)ce, (long long)cs, (long long)k);
            printf("%10lld %9g %9lld %10.2f %10.2f %8d %12.2f %10.2f %10.2f\n", (long long)n,
                   sparsities[si], (long long)k, bench_median(te, reps),
                   bench_median(ts, reps), passes, acc, bench_median(tf, reps),
                   bench_median(th, reps));
        }
        free(te);
        free(ts);
        free(ta);
        free(tf);
        free(th);
        free(v);
        free(u);
        free(g);
        free(w);
        free(scratch);
        free(idx);
    }
    return 0;
}
