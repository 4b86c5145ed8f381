/* ctr_train.c - one process training wide&deep (or DeepFM) on ctr_synth, the workload of
 * bench/ctr_train_torch.py, for the comparison bench/ctr_train.sh prints: examples per second of
 * whole training steps (lookup, row pull from local fl_ps_sparse tables, forward, sigmoid
 * cross-entropy, backward, row push with Paddle's sparse Adagrad, Momentum on the dense part)
 * and the validation AUC after all of them. The push finds each row by the slot its pull
 * returned (fl_ps_sparse_pull_rows_slots / push_rows_slots), not through the table's index.
 *
 * Usage: ctr_train MODEL BATCH STEPS PASSES VOCAB [DUMP_DIR]
 *   The data are PASSES x STEPS distinct batches of BATCH samples of ctr_synth's train split
 *   (seed 1, VOCAB values a slot), generated in memory before any timing, and 8192 validation
 *   samples. Pass 0 warms up; passes 1.. are timed, each over its own STEPS batches. Prints one
 *   line: the median examples/s (wall) of the timed passes, each pass's, the validation AUC
 *   after every pass, the median examples per CPU second (the process's CPU time, all threads:
 *   what a loaded machine distorts least), the final log loss, and the teacher's best AUC on
 *   those validation samples. CTR_TRAIN_PHASES set in the environment: also prints to stderr
 *   the CPU milliseconds a step of each phase (prepare, pull, forward and loss, backward, push,
 *   momentum), over the timed passes.
 *   DUMP_DIR: also writes the data there for the PyTorch side (then exits without training):
 *   train_{labels.i32,dense.f32,offsets.i64,index.i64} and val_* likewise, ids replaced by dense
 *   row numbers 0.. (numbered in order of first appearance, train then validation), and
 *   meta.txt: "samples val_samples nslots ndense rows". */
#include "fleet/ctr.h"
#include "fleet/metrics.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/ps.h"
#include "fleet/sparse.h"
#include "fleet/status.h"
#include "bench_time.h"

#include "ps/table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VAL_SAMPLES 8192
#define EVAL_BATCH 512
#define SPARSE_LR 2.0 /* test_ctr_model's: Paddle's sparse Adagrad on the mean loss */
#define DENSE_LR 0.1
#define NPHASES 6 /* CTR_TRAIN_PHASES: prepare, pull, forward+loss, backward, push, momentum */

static void die(const char *what) {
    fprintf(stderr, "ctr_train: %s: %s\n", what, fl_errmsg());
    exit(1);
}

/* ---- the dump for the PyTorch side ---- */

typedef struct {
    uint64_t *keys;
    int64_t  *vals;
    int64_t   cap, n;
} id_map;

static int64_t map_get(id_map *m, uint64_t id) {
    uint64_t h = id * 0x9e3779b97f4a7c15ULL;
    int64_t i = (int64_t)(h >> 20) & (m->cap - 1);
    while (m->vals[i] >= 0 && m->keys[i] != id)
        i = (i + 1) & (m->cap - 1);
    if (m->vals[i] < 0) {
        if (m->n * 2 >= m->cap) {
            fprintf(stderr, "ctr_train: id map full\n");
            exit(1);
        }
        m->keys[i] = id;
        m->vals[i] = m->n++;
    }
    return m->vals[i];
}

static void write_file(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "ctr_train: cannot write %s\n", path);
        exit(1);
    }
}

/* Writes batches[0..n) as one set of arrays, prefix "train_" or "val_". */
static void dump_set(const char *dir, const char *prefix, fl_ctr_batch *const *batches, int n,
                     id_map *map) {
    int64_t samples = 0, ids = 0;
    int S = batches[0]->nslots, ND = batches[0]->ndense;
    for (int k = 0; k < n; k++) {
        samples += batches[k]->batch;
        ids += fl_ctr_batch_nids(batches[k]);
    }
    int32_t *labels = malloc((size_t)samples * sizeof *labels);
    float *dense = malloc((size_t)(samples * ND) * sizeof *dense);
    int64_t *offsets = malloc((size_t)(samples * S + 1) * sizeof *offsets);
    int64_t *index = malloc((size_t)(ids > 0 ? ids : 1) * sizeof *index);
    int64_t s0 = 0, i0 = 0;
    offsets[0] = 0;
    for (int k = 0; k < n; k++) {
        const fl_ctr_batch *b = batches[k];
        memcpy(labels + s0, b->labels, (size_t)b->batch * sizeof *labels);
        memcpy(dense + s0 * ND, b->dense, (size_t)(b->batch * ND) * sizeof *dense);
        for (int64_t q = 1; q <= b->batch * S; q++)
            offsets[s0 * S + q] = i0 + b->offsets[q];
        for (int64_t q = 0; q < fl_ctr_batch_nids(b); q++)
            index[i0 + q] = map_get(map, b->ids[q]);
        s0 += b->batch;
        i0 += fl_ctr_batch_nids(b);
    }
    char name[64];
    snprintf(name, sizeof name, "%slabels.i32", prefix);
    write_file(dir, name, labels, (size_t)samples * sizeof *labels);
    snprintf(name, sizeof name, "%sdense.f32", prefix);
    write_file(dir, name, dense, (size_t)(samples * ND) * sizeof *dense);
    snprintf(name, sizeof name, "%soffsets.i64", prefix);
    write_file(dir, name, offsets, (size_t)(samples * S + 1) * sizeof *offsets);
    snprintf(name, sizeof name, "%sindex.i64", prefix);
    write_file(dir, name, index, (size_t)ids * sizeof *index);
    free(labels);
    free(dense);
    free(offsets);
    free(index);
}

/* ---- training ---- */

/* Each table's row slots of the last pull: the push of the same rows uses them as hints
 * (fl_ps_sparse_push_rows_slots) and so skips the index. */
static int64_t *slots[FL_CTR_NTABLES];
static int64_t  slots_cap[FL_CTR_NTABLES];

static void pull(fl_ctr_model *m, fl_ps_sparse *const *tables) {
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        fl_sparse_rows *r = fl_ctr_model_rows(m, t);
        if (r->n > slots_cap[t]) {
            free(slots[t]);
            slots_cap[t] = 2 * r->n;
            if (!(slots[t] = malloc((size_t)slots_cap[t] * sizeof *slots[t]))) {
                fprintf(stderr, "ctr_train: out of memory\n");
                exit(1);
            }
        }
        if (fl_ps_sparse_pull_rows_slots(tables[t], r->ids, r->n, r->rows, slots[t]) < 0)
            die("pull");
    }
}

static void evaluate(fl_ctr_model *m, fl_ps_sparse *const *tables, fl_ctr_batch *const *val,
                     int nval, double *auc, double *logloss) {
    fl_ctr_metrics met;
    if (fl_ctr_metrics_init(&met, FL_AUC_THRESHOLDS) < 0)
        die("metrics");
    float p[EVAL_BATCH];
    for (int k = 0; k < nval; k++) {
        const fl_tensor *lg;
        fl_tensor pt;
        double loss;
        if (fl_ctr_model_prepare(m, val[k]) < 0)
            die("prepare");
        pull(m, tables);
        fl_tensor_view(&pt, FL_DTYPE_F32, 1, (int64_t[]){val[k]->batch}, p);
        if (fl_ctr_model_forward(m, false, &lg) < 0 ||
            fl_sigmoid_xent_forward(lg, val[k]->labels, &pt, &loss) < 0 ||
            fl_ctr_metrics_add(&met, p, val[k]->labels, val[k]->batch) < 0)
            die("evaluate");
    }
    *auc = fl_ctr_metrics_auc(&met);
    *logloss = fl_ctr_metrics_logloss(&met);
    fl_ctr_metrics_free(&met);
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: ctr_train MODEL BATCH STEPS PASSES VOCAB [DUMP_DIR]\n");
        return 2;
    }
    fl_ctr_model_type type;
    int64_t batch = atoll(argv[2]), vocab = atoll(argv[5]);
    int steps = atoi(argv[3]), passes = atoi(argv[4]);
    if (fl_ctr_model_type_parse(argv[1], &type) < 0 || batch < 1 || batch > 65536 || steps < 1 ||
        passes < 2 || passes > 64 || vocab < 1) {
        fprintf(stderr, "ctr_train: bad arguments (%s)\n", fl_errmsg());
        return 2;
    }
    fl_ctr_synth_config sc = fl_ctr_synth_config_default();
    sc.vocab = vocab;
    fl_ctr_synth *train = fl_ctr_synth_create(&sc);
    sc.split = 1;
    fl_ctr_synth *valsyn = fl_ctr_synth_create(&sc);
    if (!train || !valsyn)
        die("ctr_synth");
    int nb = passes * steps, nval = VAL_SAMPLES / EVAL_BATCH;
    fl_ctr_batch **data = calloc((size_t)nb, sizeof *data), **val = calloc((size_t)nval, 8);
    for (int k = 0; k < nb + nval; k++) {
        fl_ctr_batch *b = malloc(sizeof *b);
        int64_t bs = k < nb ? batch : EVAL_BATCH;
        if (!b || fl_ctr_batch_init(b, sc.ndense, sc.nslots, bs, bs * sc.nslots) < 0 ||
            fl_ctr_synth_batch(k < nb ? train : valsyn, k < nb ? k : k - nb, 0, 1, bs, b) < 0)
            die("generating the data");
        if (k < nb)
            data[k] = b;
        else
            val[k - nb] = b;
    }
    double best = 0;
    if (fl_ctr_synth_best_auc(valsyn, VAL_SAMPLES, &best) < 0)
        die("best AUC");

    if (argc == 7) {
        id_map map = {.cap = 1 << 24};
        map.keys = malloc((size_t)map.cap * sizeof *map.keys);
        map.vals = malloc((size_t)map.cap * sizeof *map.vals);
        memset(map.vals, 0xff, (size_t)map.cap * sizeof *map.vals);
        dump_set(argv[6], "train_", data, nb, &map);
        dump_set(argv[6], "val_", val, nval, &map);
        char meta[256];
        int len = snprintf(meta, sizeof meta, "%lld %d %d %d %lld %.6f\n", (long long)nb * batch,
                           VAL_SAMPLES, sc.nslots, sc.ndense, (long long)map.n, best);
        write_file(argv[6], "meta.txt", meta, (size_t)len);
        fprintf(stderr, "ctr_train: wrote %lld samples, %lld distinct ids to %s\n",
                (long long)nb * batch, (long long)map.n, argv[6]);
        return 0;
    }

    fl_ctr_model_config mc = fl_ctr_model_config_default(type);
    mc.max_batch = batch > EVAL_BATCH ? batch : EVAL_BATCH;
    fl_ctr_model *m;
    if (fl_ctr_model_create(&mc, &m) < 0)
        die("model");
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
    fl_ps_init_rule init_emb = {.type = FL_PS_INIT_UNIFORM, .a = -0.05, .b = 0.05, .seed = 7};
    fl_ps_init_rule init_wide = {.type = FL_PS_INIT_ZERO, .seed = 7};
    fl_ps_sparse *tables[FL_CTR_NTABLES];
    if (fl_ps_sparse_create(0, mc.embed_dim, &rule, &init_emb, &tables[0]) < 0 ||
        fl_ps_sparse_create(1, 1, &rule, &init_wide, &tables[1]) < 0)
        die("tables");
    fl_net *net = fl_ctr_model_net(m);
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
    if (!opt)
        die("optimizer");
    /* CTR_TRAIN_PHASES set: each phase's CPU time, summed over the timed passes */
    bool phases = getenv("CTR_TRAIN_PHASES") != NULL, timed = false;
    double phase_s[NPHASES] = {0}, tp = 0;
#define PHASE_START()                                                                        \
    do {                                                                                     \
        if (phases)                                                                          \
            tp = bench_cpu_s();                                                              \
    } while (0)
#define PHASE(k)                                                                             \
    do {                                                                                     \
        if (phases && timed) {                                                               \
            double now_ = bench_cpu_s();                                                     \
            phase_s[k] += now_ - tp;                                                         \
            tp = now_;                                                                       \
        }                                                                                    \
    } while (0)
    float *dl = malloc((size_t)batch * sizeof *dl);
    double rate[64], cpu_rate[64], sorted[64], auc[64], logloss[64];
    for (int pass = 0; pass < passes; pass++) {
        double t0 = bench_wall_s(), c0 = bench_cpu_s();
        timed = pass > 0;
        for (int s = 0; s < steps; s++) {
            const fl_ctr_batch *b = data[pass * steps + s];
            const fl_tensor *lg;
            fl_tensor dlt;
            PHASE_START();
            if (fl_ctr_model_prepare(m, b) < 0)
                die("prepare");
            PHASE(0);
            pull(m, tables);
            PHASE(1);
            fl_tensor_view(&dlt, FL_DTYPE_F32, 1, (int64_t[]){b->batch}, dl);
            if (fl_ctr_model_forward(m, true, &lg) < 0 ||
                fl_sigmoid_xent_backward(lg, b->labels, &dlt) < 0)
                die("step");
            PHASE(2);
            if (fl_ctr_model_backward(m, &dlt) < 0)
                die("step");
            PHASE(3);
            for (int t = 0; t < FL_CTR_NTABLES; t++) {
                fl_sparse_rows *r = fl_ctr_model_rows(m, t);
                if (fl_ps_sparse_push_rows_slots(tables[t], r->ids, slots[t], r->n, r->grads,
                                                 NULL, NULL, SPARSE_LR) < 0)
                    die("push");
            }
            PHASE(4);
            if (fl_optim_step(opt, DENSE_LR, NULL) < 0)
                die("optimizer step");
            PHASE(5);
        }
        rate[pass] = (double)(steps * batch) / (bench_wall_s() - t0);
        cpu_rate[pass] = (double)(steps * batch) / (bench_cpu_s() - c0);
        evaluate(m, tables, val, nval, &auc[pass], &logloss[pass]);
    }
    memcpy(sorted, rate + 1, (size_t)(passes - 1) * sizeof *rate);
    printf("%.1f passes", bench_median(sorted, passes - 1));
    for (int p = 0; p < passes; p++)
        printf(" %.1f", rate[p]);
    printf(" auc");
    for (int p = 0; p < passes; p++)
        printf(" %.4f", auc[p]);
    memcpy(sorted, cpu_rate + 1, (size_t)(passes - 1) * sizeof *rate);
    printf(" cpu %.1f", bench_median(sorted, passes - 1));
    printf(" logloss %.4f best %.4f rows %lld\n", logloss[passes - 1], best,
           (long long)fl_ps_sparse_rows(tables[0]));
    if (phases) {
        static const char *names[NPHASES] = {"prepare", "pull", "forward+loss", "backward",
                                             "push", "momentum"};
        fprintf(stderr, "ctr_train: CPU ms a step over passes 1-%d:", passes - 1);
        for (int k = 0; k < NPHASES; k++)
            fprintf(stderr, " %s %.3f", names[k], 1e3 * phase_s[k] / ((passes - 1) * steps));
        fprintf(stderr, "\n");
    }
    free(dl);
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        free(slots[t]);
    fl_optim_free(opt);
    fl_ps_sparse_free(tables[0]);
    fl_ps_sparse_free(tables[1]);
    fl_ctr_model_free(m);
    for (int k = 0; k < nb; k++) {
        fl_ctr_batch_free(data[k]);
        free(data[k]);
    }
    for (int k = 0; k < nval; k++) {
        fl_ctr_batch_free(val[k]);
        free(val[k]);
    }
    free(data);
    free(val);
    fl_ctr_synth_free(train);
    fl_ctr_synth_free(valsyn);
    return 0;
}
