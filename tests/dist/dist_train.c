/* dist_train.c - the training program the distributed tests run: an MLP on the teacher task
 * under fl_distributed_optimizer with the strategy the flags give; rank 0 writes the final
 * parameters (raw f32) so that runs with other worker counts and strategies can be compared,
 * which --compare does. Run it under fleetrun, or alone (a job of one).
 *
 * Data order: update s of a run with N workers, local batch b and gradient merge k is global
 * batch s of N*k*b samples of the loader's permutation. Rank r's share is the slice
 * [r*k*b, (r+1)*k*b) and its micro-batch j the sub-slice [(r*k+j)*b, (r*k+j+1)*b): a loader of
 * world N*k, rank r*k+j, batch b. So rank r's k micro-batches are exactly its batch in a run
 * with local batch k*b and no merge, and the union over ranks is exactly the batch of a single
 * worker with batch N*k*b. */
#include "dgc_ledger.h"

#include "fleet/fleet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OVERRIDES 32
#define MAX_KEYS 64

static void usage(FILE *f) {
    fprintf(f,
            "usage: dist_train [options]          (under fleetrun, or alone)\n"
            "  --optimizer sgd|momentum  --momentum MU (0.9)  --weight-decay WD (0)  --nesterov\n"
            "  --lr LR (0.05)  --clip NORM (global gradient-norm clipping; 0: off)\n"
            "  --batch B (16, per worker and micro-step)  --steps S (30 updates)  --seed N (1)\n"
            "  --data teacher|random  --data-size N (8192)  --threads N (1)\n"
            "  --fuse MB  --overlap on|off  --fp16-allreduce  --merge K  --merge-avg on|off\n"
            "  --dgc  -o strategy.KEY=VALUE (any strategy key)\n"
            "  --check-dgc (DGC's conservation, every update: dgc_ledger.h; no --merge)\n"
            "  --out FILE (final parameters, f32)  --out-init FILE (after the broadcast)\n"
            "  --out-every-rank (each rank r also writes its parameters to FILE.r)\n"
            "dist_train --compare A B [--rtol R (1e-5)] [--base C --factor F]\n"
            "  max |a - b| / max |b| over the parameters; with --base: a - c against F (b - c)\n");
}

/* --compare: prints the relative difference; 0 if within rtol, 1 if not, 2 on bad files. */
static float *read_params(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    float *v = NULL;
    if (!f || fseek(f, 0, SEEK_END) != 0) {
        fprintf(stderr, "dist_train: cannot read %s\n", path);
        goto done;
    }
    *n = ftell(f) / (long)sizeof(float);
    rewind(f);
    v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    if (!v || fread(v, sizeof *v, (size_t)*n, f) != (size_t)*n) {
        fprintf(stderr, "dist_train: cannot read %ld floats from %s\n", *n, path);
        free(v);
        v = NULL;
    }
done:
    if (f)
        fclose(f);
    return v;
}

static int compare(const char *pa, const char *pb, const char *pc, double factor, double rtol) {
    long na = 0, nb = 0, nc = 0;
    float *a = read_params(pa, &na), *b = read_params(pb, &nb);
    float *c = pc ? read_params(pc, &nc) : NULL;
    int rc = 2;
    if (!a || !b || (pc && !c))
        goto done;
    if (na != nb || (pc && nc != na)) {
        fprintf(stderr, "dist_train: %s has %ld values, %s %ld\n", pa, na, pb, nb);
        goto done;
    }
    double maxdiff = 0, maxref = 0;
    long at = -1;
    for (long i = 0; i < na; i++) {
        double x = a[i], y = b[i];
        if (c) {
            x -= c[i];
            y = factor * (y - c[i]);
        }
        double dd = fabs(x - y);
        if (dd > maxdiff || isnan(dd)) {
            maxdiff = isnan(dd) ? INFINITY : dd;
            at = i;
        }
        if (fabs(y) > maxref)
            maxref = fabs(y);
    }
    double rel = maxref > 0 ? maxdiff / maxref : maxdiff;
    printf("max_rel_diff %.3e (max |a-b| %.3e at [%ld] of %ld values; max |b| %.3e; rtol %.1e)\n",
           rel, maxdiff, at, na, maxref, rtol);
    rc = rel <= rtol ? 0 : 1;
done:
    free(a);
    free(b);
    free(c);
    return rc;
}

static int write_params(fl_net *net, const char *path) {
    int64_t count = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        count += fl_net_param(net, i)->value.numel;
    FILE *f = fopen(path, "wb");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open for writing", path);
    size_t w = fwrite(fl_net_flat_params(net), sizeof(float), (size_t)count, f);
    if (fclose(f) != 0 || w != (size_t)count)
        return fl_fail(FL_EIO, "%s: write failed", path);
    return FL_OK;
}

typedef struct {
    int         optimizer; /* fl_optim_type */
    double      momentum, weight_decay, lr, clip_norm;
    bool        nesterov;
    int64_t     batch, steps, seed, data_size, threads;
    bool        random_data, check_dgc, out_every_rank;
    const char *out, *out_init;
    const char *overrides[MAX_OVERRIDES];
    int         noverrides;
    char        buf[MAX_OVERRIDES][160];
} options;

static int add_override(options *o, const char *key, const char *value) {
    if (o->noverrides == MAX_OVERRIDES) {
        fprintf(stderr, "dist_train: too many strategy options\n");
        return -1;
    }
    char *s = o->buf[o->noverrides];
    snprintf(s, sizeof o->buf[0], "%s%s%s", key, value ? "=" : "", value ? value : "");
    o->overrides[o->noverrides++] = s;
    return 0;
}

/* Parses the training flags; strategy flags become "strategy.KEY=VALUE" overrides, read through
 * fl_strategy_schema as a config file's strategy section would be. */
static int parse(int argc, char **argv, options *o) {
    *o = (options){.momentum = 0.9, .lr = 0.05, .batch = 16, .steps = 30, .seed = 1,
                   .data_size = 8192, .threads = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, used = 1;
        if (!strcmp(a, "--fp16-allreduce"))
            rc = add_override(o, "strategy.fp16_allreduce", "true"), used = 0;
        else if (!strcmp(a, "--nesterov"))
            o->nesterov = true, used = 0;
        else if (!strcmp(a, "--dgc"))
            rc = add_override(o, "strategy.dgc", "true"), used = 0;
        else if (!strcmp(a, "--check-dgc"))
            o->check_dgc = true, used = 0;
        else if (!strcmp(a, "--out-every-rank"))
            o->out_every_rank = true, used = 0;
        else if (!v)
            goto bad;
        else if (!strcmp(a, "--optimizer") && (!strcmp(v, "sgd") || !strcmp(v, "momentum")))
            o->optimizer = !strcmp(v, "sgd") ? FL_OPTIM_SGD : FL_OPTIM_MOMENTUM;
        else if (!strcmp(a, "--momentum"))
            o->momentum = atof(v);
        else if (!strcmp(a, "--weight-decay"))
            o->weight_decay = atof(v);
        else if (!strcmp(a, "--clip"))
            o->clip_norm = atof(v);
        else if (!strcmp(a, "--lr"))
            o->lr = atof(v);
        else if (!strcmp(a, "--batch"))
            o->batch = atoll(v);
        else if (!strcmp(a, "--steps"))
            o->steps = atoll(v);
        else if (!strcmp(a, "--seed"))
            o->seed = atoll(v);
        else if (!strcmp(a, "--data-size"))
            o->data_size = atoll(v);
        else if (!strcmp(a, "--threads"))
            o->threads = atoll(v);
        else if (!strcmp(a, "--data") && (!strcmp(v, "teacher") || !strcmp(v, "random")))
            o->random_data = !strcmp(v, "random");
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--out-init"))
            o->out_init = v;
        else if (!strcmp(a, "--fuse"))
            rc = add_override(o, "strategy.fuse_grad_size_in_MB", v);
        else if (!strcmp(a, "--overlap"))
            rc = add_override(o, "strategy.overlap", v);
        else if (!strcmp(a, "--merge")) {
            rc = add_override(o, "strategy.gradient_merge", "true");
            if (rc == 0)
                rc = add_override(o, "strategy.gradient_merge_configs.k_steps", v);
        } else if (!strcmp(a, "--merge-avg"))
            rc = add_override(o, "strategy.gradient_merge_configs.avg", v);
        else if (!strcmp(a, "-o"))
            rc = add_override(o, v, NULL);
        else
            goto bad;
        if (rc < 0)
            return -1;
        i += used;
    }
    if (o->batch < 1 || o->steps < 1 || o->data_size < 1) {
        fprintf(stderr, "dist_train: --batch, --steps and --data-size must be >= 1\n");
        return -1;
    }
    return 0;
bad:
    usage(stderr);
    return -1;
}

static int train(const options *o, const fl_strategy *strategy) {
    fl_fleet *fleet = NULL;
    fl_net *net = NULL;
    fl_dataset *ds = NULL;
    fl_loader **loaders = NULL;
    fl_optim *opt = NULL;
    fl_dist_optim *dopt = NULL;
    dgc_ledger *ledger = NULL;
    float *probs_mem = NULL;
    double *losses = NULL;
    int64_t k = strategy->gradient_merge ? strategy->gradient_merge_configs.k_steps : 1;
    int64_t nloaders = 0, *epochs = NULL;
    int rc;

    fl_kernels_set_threads((int)o->threads);
    if ((rc = fl_fleet_init(NULL, &fleet)) < 0)
        goto fail;
    int rank = fl_worker_index(fleet), world = fl_worker_num(fleet);

    const int64_t features = 32, classes = 4, hidden[] = {128, 128}, in_shape[] = {features};
    net = fl_model_mlp(FL_DTYPE_F32, features, hidden, 2, FL_ACT_TANH, classes);
    if (!net || (rc = fl_net_build(net, 1, in_shape, o->batch, (uint64_t)o->seed)) < 0)
        goto fail;
    ds = o->random_data
             ? fl_dataset_random_create(o->data_size, features, (int)classes, (uint64_t)o->seed)
             : fl_dataset_teacher_create(o->data_size, features, 16, (int)classes, 7, 0);
    loaders = calloc((size_t)k, sizeof *loaders);
    epochs = calloc((size_t)k, sizeof *epochs);
    probs_mem = malloc((size_t)(o->batch * classes) * sizeof *probs_mem);
    losses = calloc((size_t)o->steps, sizeof *losses);
    if (!ds || !loaders || !epochs || !probs_mem || !losses) {
        rc = FL_ENOMEM;
        goto fail;
    }
    for (; nloaders < k; nloaders++) { /* micro-batch j of rank r: see the file comment */
        fl_loader_config lc = {.batch_size = o->batch, .shuffle = true, .drop_last = true,
                               .seed = (uint64_t)o->seed, .rank = (int)(rank * k + nloaders),
                               .world = (int)(world * k)};
        if (!(loaders[nloaders] = fl_loader_create(ds, &lc))) {
            rc = FL_EINVAL;
            goto fail;
        }
    }
    fl_optim_config oc = {.type = (fl_optim_type)o->optimizer, .weight_decay = o->weight_decay,
                          .momentum = o->optimizer == FL_OPTIM_MOMENTUM ? o->momentum : 0,
                          .nesterov = o->nesterov, .clip_norm = o->clip_norm};
    opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net), FL_DTYPE_F32,
                          fl_net_backend(net));
    if (!opt || !(dopt = fl_distributed_optimizer(fleet, net, opt, strategy))) {
        rc = FL_EINVAL;
        goto fail;
    }
    if (rank == 0 && o->out_init && (rc = write_params(net, o->out_init)) < 0)
        goto fail;
    if (o->check_dgc && (k != 1 || !(ledger = dgc_ledger_create(dopt, net)))) {
        rc = fl_fail(FL_EINVAL, "--check-dgc needs the dgc strategy with a compressed tensor and "
                                "no gradient merge");
        goto fail;
    }

    /* training: k calls of fl_dist_minimize per update; count which calls sent bytes */
    int calls = 0, updates = 0, sending = 0, mismatched = 0;
    for (int64_t s = 0; s < o->steps; s++) {
        for (int64_t j = 0; j < k; j++) {
            const fl_tensor *x, *logits;
            const int32_t *y;
            fl_tensor probs;
            double cost;
            bool updated;
            rc = fl_loader_next(loaders[j], &x, &y);
            if (rc == 0) { /* the next epoch */
                if ((rc = fl_loader_seek(loaders[j], ++epochs[j], 0)) < 0 ||
                    (rc = fl_loader_next(loaders[j], &x, &y)) < 0)
                    goto fail;
            }
            if (rc < 0 || (rc = fl_net_forward(net, x, true, &logits)) < 0)
                goto fail;
            fl_tensor_view(&probs, FL_DTYPE_F32, 2, logits->shape, probs_mem);
            if ((rc = fl_softmax_xent_forward(fl_net_backend(net), logits, y, &probs, &cost)) < 0 ||
                (rc = fl_softmax_xent_backward(fl_net_backend(net), &probs, y, &probs)) < 0)
                goto fail;
            /* the update's mean loss so far: adaptive Local SGD follows it */
            if ((rc = fl_dist_set_loss(dopt, (losses[s] * (double)k + cost) / (double)(j + 1))) < 0)
                goto fail;
            uint64_t before = fl_dist_bytes_sent(dopt);
            if (ledger)
                dgc_ledger_before(ledger);
            if ((rc = fl_dist_minimize(dopt, &probs, o->lr, &updated)) < 0)
                goto fail;
            bool sent = fl_dist_bytes_sent(dopt) > before;
            if (ledger && (rc = dgc_ledger_after(ledger, fl_fleet_comm(fleet), o->lr)) < 0)
                goto fail;
            calls++;
            updates += updated;
            sending += sent;
            mismatched += world > 1 && sent != updated;
            losses[s] += cost / (double)k;
        }
    }
    uint64_t bytes = fl_dist_bytes_sent(dopt);
    /* the mean loss over workers, per update (after the byte count: this sends too) */
    if ((rc = fl_comm_allreduce(fl_fleet_comm(fleet), losses, (size_t)o->steps, FL_DTYPE_F64,
                                FL_REDOP_AVG)) < 0)
        goto fail;
    if (rank == 0) {
        for (int64_t s = 0; s < o->steps; s++)
            printf("step %lld loss %.6f\n", (long long)s, losses[s]);
        printf("dist_train: world %d calls %d updates %d sending_calls %d mismatched %d "
               "bytes_sent %llu bytes_per_update %.1f\n",
               world, calls, updates, sending, mismatched, (unsigned long long)bytes,
               updates ? (double)bytes / updates : 0.0);
        if (o->out && (rc = write_params(net, o->out)) < 0)
            goto fail;
    }
    if (o->out && o->out_every_rank) { /* replicas that must agree bit for bit */
        char path[512];
        snprintf(path, sizeof path, "%s.%d", o->out, rank);
        if ((rc = write_params(net, path)) < 0)
            goto fail;
    }
    fl_dist_stats st;
    fl_dist_get_stats(dopt, &st);
    if (!isnan(st.loss_scale)) /* strategy.amp: every rank's own view of the scale */
        printf("dist_train: rank %d loss_scale %g skipped %lld\n", rank, st.loss_scale,
               (long long)st.skipped);
    if (ledger) { /* every rank's own counts */
        printf("dist_train: rank %d dgc pairs %lld dropped %lld ledger %.3e\n", rank,
               (long long)st.pairs, (long long)st.dropped, dgc_ledger_worst(ledger));
    }
    rc = 0;
fail:
    if (rc < 0)
        fprintf(stderr, "dist_train: error: %s\n", fl_errmsg());
    dgc_ledger_free(ledger);
    fl_dist_optim_free(dopt);
    fl_optim_free(opt);
    for (int64_t j = 0; j < nloaders; j++)
        fl_loader_free(loaders[j]);
    free(loaders);
    free(epochs);
    free(probs_mem);
    free(losses);
    fl_dataset_free(ds);
    fl_net_free(net);
    fl_fleet_free(fleet);
    return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--compare")) {
        const char *base = NULL;
        double rtol = 1e-5, factor = 1;
        if (argc < 4) {
            usage(stderr);
            return 2;
        }
        for (int i = 4; i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--rtol"))
                rtol = atof(argv[i + 1]);
            else if (!strcmp(argv[i], "--base"))
                base = argv[i + 1];
            else if (!strcmp(argv[i], "--factor"))
                factor = atof(argv[i + 1]);
            else {
                usage(stderr);
                return 2;
            }
        }
        return compare(argv[2], argv[3], base, factor, rtol);
    }

    options o;
    if (parse(argc, argv, &o) < 0)
        return 2;
    /* the strategy: defaults, then the flags as config overrides; checked before training */
    fl_strategy s;
    fl_cfg_key keys[MAX_KEYS];
    bool was_set[MAX_KEYS];
    fl_strategy_defaults(&s);
    int nkeys = fl_strategy_schema("strategy", 0, keys, MAX_KEYS);
    if (nkeys < 0 || nkeys > MAX_KEYS ||
        fl_config_load(NULL, o.overrides, o.noverrides, keys, nkeys, &s, was_set) < 0 ||
        fl_strategy_check(&s, was_set, (fl_optim_type)o.optimizer) < 0) {
        fprintf(stderr, "dist_train: error: %s\n", fl_errmsg());
        return 2;
    }
    return train(&o, &s);
}
