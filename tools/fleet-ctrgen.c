/* fleet-ctrgen - writes the synthetic CTR task (ctr_synth) in Criteo's text format, so that
 * the Criteo reader is tested on the task's own data, and prints the teacher's positive rate
 * and best possible AUC; --verify reads such a file back through the reader and checks that
 * it gives exactly the task's samples. Thin: parses arguments and calls the library
 * (include/fleet/ctr.h). */
#include "fleet/ctr.h"
#include "fleet/status.h"
#include "io/atomic.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: fleet-ctrgen --samples N --out FILE [options]\n"
            "       fleet-ctrgen --samples N --verify FILE [options]\n"
            "\n"
            "Writes samples [first, first + N) of the synthetic CTR task as lines of Criteo's\n"
            "format (label, dense integers, hexadecimal values; tab-separated), or checks that\n"
            "FILE read by fleet's Criteo reader gives exactly those samples (exit 1 if not).\n"
            "\n"
            "  --seed S          teacher and samples (1)\n"
            "  --split 0|1       train or validation samples (0)\n"
            "  --first I         index of the first sample (0)\n"
            "  --slots K         categorical slots (26)\n"
            "  --dense D         integer features (13)\n"
            "  --vocab V         values per slot, up to 4294967295; 1e6 is accepted (1e6)\n"
            "  --zipf S          popularity exponent (1.1)\n"
            "  --max-ids K       ids per slot 1..K; K > 1 writes comma-joined values (1)\n"
            "  --missing P       probability of an empty slot / dense value (0.1)\n"
            "  --ctr P           positive rate the teacher is calibrated to (0.26)\n"
            "  --sparse-scale X  std of the logit's sparse part (1.5)\n"
            "  --dense-scale X   dense weights' scale (1.0)\n"
            "  --transform T     minmax (PaddleRec's, needs --dense 13), log or raw (minmax)\n"
            "  --best-auc N      validation samples for the best AUC; 0 skips it (200000)\n");
}

static int is_known(const char *a) {
    static const char *const known[] = {"--seed", "--split", "--slots", "--dense", "--vocab",
                                        "--max-ids"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(a, known[i]))
            return 1;
    return 0;
}

static int parse_num(const char *flag, const char *s, double lo, double hi, int integer,
                     double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi) || (integer && v != floor(v)))
        return fl_fail(FL_EINVAL, "%s: '%s' is not %s in [%.17g, %.17g]", flag, s,
                       integer ? "an integer" : "a number", lo, hi);
    *out = v;
    return FL_OK;
}

/* Writes samples [first, first + n) to path atomically. */
static int write_samples(const fl_ctr_synth *s, int64_t first, int64_t n, const char *path,
                         double *rate) {
    fl_atomic_file f;
    FL_TRY(fl_atomic_begin(&f, path));
    size_t cap = fl_ctr_synth_line_max(s), chunk = 1 << 20, used = 0;
    char *buf = malloc(chunk + cap + 1);
    if (!buf) {
        fl_atomic_abort(&f);
        return fl_fail(FL_ENOMEM, "out of memory");
    }
    int rc = FL_OK;
    double pos = 0;
    for (int64_t i = 0; i < n && rc >= 0; i++) {
        int len = fl_ctr_synth_line(s, first + i, buf + used, cap, NULL);
        if (len < 0) {
            rc = len;
            break;
        }
        pos += buf[used] == '1';
        used += (size_t)len;
        buf[used++] = '\n';
        if (used >= chunk || i == n - 1) {
            rc = fl_atomic_write(&f, buf, used);
            used = 0;
        }
    }
    free(buf);
    if (rc < 0) {
        fl_atomic_abort(&f);
        return rc;
    }
    *rate = n ? pos / (double)n : 0;
    return fl_atomic_commit(&f);
}

/* Reads path with the Criteo reader and compares it with samples [first, first + n). */
static int verify(const fl_ctr_synth *s, int64_t first, int64_t n, const char *path) {
    const fl_ctr_synth_config *sc = fl_ctr_synth_config_of(s);
    fl_criteo_config c = fl_criteo_config_default();
    const char *files[1] = {path};
    c.files = files;
    c.nfiles = 1;
    c.format.ndense = sc->ndense;
    c.format.nslots = sc->nslots;
    c.format.transform = sc->transform;
    c.format.missing_id = false; /* ctr_synth's empty slots are empty bags */
    c.batch_size = 1024;
    fl_criteo_reader *r = fl_criteo_open(&c);
    if (!r)
        return -1;
    fl_ctr_batch want;
    int rc = fl_ctr_batch_init(&want, sc->ndense, sc->nslots, 1, (int64_t)sc->nslots * sc->max_ids);
    int64_t line = 0;
    const fl_ctr_batch *b;
    while (rc >= 0 && (rc = fl_criteo_next(r, &b)) == 1) {
        for (int64_t i = 0; i < b->batch && rc >= 0; i++, line++) {
            if (line >= n) {
                rc = fl_fail(FL_EFORMAT, "%s: more than %lld lines", path, (long long)n);
                break;
            }
            fl_ctr_batch_clear(&want);
            if ((rc = fl_ctr_synth_add(s, first + line, &want, NULL)) < 0)
                break;
            int64_t k = i * b->nslots, nid = b->offsets[k + b->nslots] - b->offsets[k];
            int same = b->labels[i] == want.labels[0] && nid == fl_ctr_batch_nids(&want) &&
                       !memcmp(b->dense + i * b->ndense, want.dense,
                               (size_t)b->ndense * sizeof(float)) &&
                       !memcmp(b->ids + b->offsets[k], want.ids, (size_t)nid * 8);
            for (int sl = 0; same && sl < b->nslots; sl++)
                same = b->offsets[k + sl + 1] - b->offsets[k] == want.offsets[sl + 1];
            if (!same)
                rc = fl_fail(FL_EFORMAT, "%s:%lld: differs from sample %lld of the task", path,
                             (long long)line + 1, (long long)(first + line));
        }
    }
    if (rc == 0 && line != n)
        rc = fl_fail(FL_EFORMAT, "%s: %lld lines, want %lld", path, (long long)line, (long long)n);
    fl_ctr_batch_free(&want);
    fl_criteo_close(r);
    if (rc < 0)
        return rc;
    printf("fleet-ctrgen: %s: %lld samples match the task\n", path, (long long)n);
    return FL_OK;
}

int main(int argc, char **argv) {
    fl_ctr_synth_config c = fl_ctr_synth_config_default();
    const char *out = NULL, *check = NULL;
    double samples = -1, first = 0, best = 200000, v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "fleet-ctrgen: error: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        int rc = FL_OK;
        if (!strcmp(a, "--samples"))
            rc = parse_num(a, val, 0, 1099511627776.0, 1, &samples);
        else if (!strcmp(a, "--out"))
            out = val;
        else if (!strcmp(a, "--verify"))
            check = val;
        else if (!strcmp(a, "--seed") && (rc = parse_num(a, val, 0, 9007199254740992.0, 1, &v)) >= 0)
            c.seed = (uint64_t)v;
        else if (!strcmp(a, "--split") && (rc = parse_num(a, val, 0, 1, 1, &v)) >= 0)
            c.split = (int)v;
        else if (!strcmp(a, "--first"))
            rc = parse_num(a, val, 0, 1099511627775.0, 1, &first);
        else if (!strcmp(a, "--slots") && (rc = parse_num(a, val, 0, FL_CTR_MAX_SLOTS, 1, &v)) >= 0)
            c.nslots = (int)v;
        else if (!strcmp(a, "--dense") && (rc = parse_num(a, val, 0, 256, 1, &v)) >= 0)
            c.ndense = (int)v;
        else if (!strcmp(a, "--vocab") && (rc = parse_num(a, val, 1, 4294967295.0, 1, &v)) >= 0)
            c.vocab = (int64_t)v;
        else if (!strcmp(a, "--zipf"))
            rc = parse_num(a, val, 1e-9, 100, 0, &c.zipf);
        else if (!strcmp(a, "--max-ids") && (rc = parse_num(a, val, 1, 16, 1, &v)) >= 0)
            c.max_ids = (int)v;
        else if (!strcmp(a, "--missing"))
            rc = parse_num(a, val, 0, 0.999, 0, &c.missing);
        else if (!strcmp(a, "--ctr"))
            rc = parse_num(a, val, 1e-6, 1 - 1e-6, 0, &c.ctr);
        else if (!strcmp(a, "--sparse-scale"))
            rc = parse_num(a, val, 0, 100, 0, &c.sparse_scale);
        else if (!strcmp(a, "--dense-scale"))
            rc = parse_num(a, val, 0, 100, 0, &c.dense_scale);
        else if (!strcmp(a, "--transform"))
            rc = fl_ctr_dense_parse(val, &c.transform);
        else if (!strcmp(a, "--best-auc"))
            rc = parse_num(a, val, 0, 1e9, 1, &best);
        else if (!is_known(a)) {
            fprintf(stderr, "fleet-ctrgen: error: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (rc < 0) {
            fprintf(stderr, "fleet-ctrgen: error: %s\n", fl_errmsg());
            return 2;
        }
    }
    if (samples < 0 || (!out) == (!check)) {
        fprintf(stderr, "fleet-ctrgen: error: give --samples and one of --out or --verify\n");
        usage(stderr);
        return 2;
    }
    fl_ctr_synth *s = fl_ctr_synth_create(&c);
    if (!s) {
        fprintf(stderr, "fleet-ctrgen: error: %s\n", fl_errmsg());
        return 2;
    }
    int status = 0;
    if (check) {
        if (verify(s, (int64_t)first, (int64_t)samples, check) < 0) {
            fprintf(stderr, "fleet-ctrgen: error: %s\n", fl_errmsg());
            fprintf(stderr, "hint: give the options (--seed, --split, --first, --slots, ...) the "
                    "file was written with\n");
            status = 1;
        }
        fl_ctr_synth_free(s);
        return status;
    }
    double rate = 0;
    if (write_samples(s, (int64_t)first, (int64_t)samples, out, &rate) < 0) {
        fprintf(stderr, "fleet-ctrgen: error: %s\n", fl_errmsg());
        fl_ctr_synth_free(s);
        return 2;
    }
    printf("fleet-ctrgen: wrote %lld samples to %s: positive rate %.4f, teacher bias %.6f\n",
           (long long)samples, out, rate, fl_ctr_synth_bias(s));
    if (best >= 2) {
        fl_ctr_synth_config vc = c;
        vc.split = 1;
        fl_ctr_synth *val = fl_ctr_synth_create(&vc);
        double auc = 0;
        if (!val || fl_ctr_synth_best_auc(val, (int64_t)best, &auc) < 0) {
            fprintf(stderr, "fleet-ctrgen: error: %s\n", fl_errmsg());
            status = 2;
        } else {
            printf("fleet-ctrgen: best AUC %.6f (the teacher's p over %lld validation samples)\n",
                   auc, (long long)best);
        }
        fl_ctr_synth_free(val);
    }
    fl_ctr_synth_free(s);
    return status;
}
