/* test_checkpoint_eval.c - inference models, offline evaluation and pretrained loading, in
 * process: fl_train_run saves a checkpoint and an inference model; fl_infer_run (fleet-eval)
 * reproduces the trainer's final validation loss and top-1 exactly, and its .npy holds, bit for
 * bit, the logits the trainer's evaluation computes batch by batch (the trainer rebuilt from the
 * checkpoint); a training checkpoint evaluates to the same bytes; a model whose shapes do not
 * fit is refused naming the tensor; checkpoint.pretrained takes the tensors whose name and
 * shape fit and leaves the others as initialised (seed 002's if_exist). */
#include "fleet/checkpoint.h"
#include "fleet/infer.h"
#include "fleet/npy.h"
#include "test.h"
#include "train/train_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[64];

static void base_config(fl_train_config *cfg) {
    fl_train_config_defaults(cfg);
    cfg->model.hidden.n = 2;
    cfg->model.hidden.v[0] = 16;
    cfg->model.hidden.v[1] = 16;
    cfg->data.train_size = 512;
    cfg->data.val_size = 200; /* not a multiple of the batch: a partial last batch */
    cfg->optimizer.type = FL_OPTIM_MOMENTUM;
    cfg->optimizer.lr.base = 0.1;
    cfg->train.batch_size = 32;
    cfg->train.epochs = 2;
    cfg->train.log_interval = 1000;
    cfg->train.seed = 11;
    snprintf(cfg->checkpoint.dir, sizeof cfg->checkpoint.dir, "%s/ck", dir);
    snprintf(cfg->checkpoint.inference_model, sizeof cfg->checkpoint.inference_model,
             "%s/model.safetensors", dir);
}

static float *read_npy(const char *path, int64_t *rows, int64_t *cols) {
    int nd;
    int64_t shape[6];
    float *v = NULL;
    CHECK_OK(fl_npy_read_f32(path, &nd, shape, &v));
    CHECK(nd == 2);
    *rows = shape[0];
    *cols = shape[1];
    return v;
}

/* the trainer, rebuilt from the checkpoint, evaluates the validation set as train_eval.c
 * does (same loader, same batches); its logits must be the .npy's, bit for bit */
static void check_trainer_logits(const fl_train_config *trained, const float *npy, int64_t rows) {
    fl_train_config cfg = *trained;
    snprintf(cfg.checkpoint.resume, sizeof cfg.checkpoint.resume, "%s/ck", dir);
    cfg.checkpoint.dir[0] = '\0';
    trainer t = {0};
    train_pos pos;
    CHECK_OK(fl_train_setup(&t, &cfg));
    CHECK_OK(fl_train_ckpt_restore(&t, &cfg, &pos));
    CHECK(pos.step == 32); /* 2 epochs of 512 / 32 */
    fl_loader_config lc = {.batch_size = cfg.train.batch_size, .shuffle = false,
                           .drop_last = false, .rank = 0, .world = 1};
    fl_loader *l = fl_loader_create(t.val_set, &lc);
    const fl_tensor *x, *logits;
    const int32_t *labels;
    int64_t at = 0, mismatched = 0;
    CHECK_OK(fl_loader_seek(l, 0, 0));
    while (fl_loader_next(l, &x, &labels) == 1 && x->shape[0] > 0) {
        CHECK_OK(fl_net_forward(t.net, x, false, &logits));
        size_t n = (size_t)(x->shape[0] * logits->shape[1]);
        if (at + x->shape[0] <= rows)
            mismatched += memcmp(logits->data, npy + at * logits->shape[1], n * sizeof(float)) != 0;
        at += x->shape[0];
    }
    CHECK(at == rows);
    CHECK(mismatched == 0);
    printf("trainer's evaluation logits = fleet-eval's .npy for all %lld samples: %s\n",
           (long long)at, mismatched ? "NO" : "bit-identical");
    fl_loader_free(l);
    fl_train_teardown(&t);
}

static void test_eval(void) {
    fl_train_config cfg;
    base_config(&cfg);
    fl_train_result tr;
    CHECK_OK(fl_train_run(&cfg, &tr));

    char model[300], npy[300], npy2[300];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(npy, sizeof npy, "%s/logits.npy", dir);
    snprintf(npy2, sizeof npy2, "%s/logits_ckpt.npy", dir);
    fl_infer_args a = {.model = model, .split = 1, .out_npy = npy};
    fl_infer_result r;
    CHECK_OK(fl_infer_run(&a, &r));
    CHECK(r.samples == 200 && r.classes == 2 && r.labelled);
    /* the same sums in the same order as the trainer's evaluation: equal doubles */
    CHECK(r.top1 == tr.val_acc1);
    CHECK(r.loss == tr.val_loss);
    printf("fleet-eval: loss %.9f top1 %.6f; fleet-train's evaluation: val_loss %.9f val_acc1 "
           "%.6f\n", r.loss, r.top1, tr.val_loss, tr.val_acc1);
    int64_t rows, cols;
    float *logits = read_npy(npy, &rows, &cols);
    CHECK(rows == 200 && cols == 2);
    if (logits)
        check_trainer_logits(&cfg, logits, rows);

    /* a training checkpoint evaluates to the same bytes (its training state skipped) */
    char ck[300];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    fl_infer_args b = {.model = ck, .split = 1, .out_npy = npy2};
    CHECK_OK(fl_infer_run(&b, &r));
    int64_t rows2, cols2;
    float *logits2 = read_npy(npy2, &rows2, &cols2);
    CHECK(logits && logits2 && rows2 == rows && cols2 == cols &&
          memcmp(logits, logits2, (size_t)(rows * cols) * sizeof(float)) == 0);
    free(logits);
    free(logits2);

    /* a model that does not fit the weights: refused, naming the tensor */
    const char *ov[] = {"model.hidden=[16, 8]"};
    fl_infer_args c = {.model = model, .split = 1, .overrides = ov, .noverrides = 1};
    CHECK_RC(fl_infer_run(&c, &r), FL_ESHAPE);
    CHECK_MSG("tensor 'fc2.weight' is F32 (16, 16) in the file but F32 (8, 16) here");
    /* no validation set */
    const char *ov2[] = {"data.val_size=0"};
    fl_infer_args d = {.model = model, .split = 1, .overrides = ov2, .noverrides = 1};
    CHECK_RC(fl_infer_run(&d, &r), FL_ECONFIG);
    CHECK_MSG("no validation set");
}

static bool same_values(fl_param *a, fl_param *b) {
    return fl_tensor_nbytes(&a->value) == fl_tensor_nbytes(&b->value) &&
           memcmp(a->value.data, b->value.data, fl_tensor_nbytes(&a->value)) == 0;
}

/* pretrained: the trained [16, 16] net's tensors go into a [16, 8] net where they fit */
static void test_pretrained(void) {
    fl_train_config cfg;
    base_config(&cfg);
    cfg.checkpoint.dir[0] = cfg.checkpoint.inference_model[0] = '\0';
    cfg.model.hidden.v[1] = 8;
    trainer fresh = {0}, pre = {0}, src = {0};
    train_pos pos;
    CHECK_OK(fl_train_setup(&fresh, &cfg));
    snprintf(cfg.checkpoint.pretrained, sizeof cfg.checkpoint.pretrained, "%s/ck", dir);
    CHECK_OK(fl_train_setup(&pre, &cfg));
    CHECK_OK(fl_train_ckpt_restore(&pre, &cfg, &pos));
    CHECK(pos.step == 0 && pos.epoch == 0 && pos.batch == 0);
    /* the source: the trained net, from the inference model */
    fl_train_config scfg;
    base_config(&scfg);
    scfg.checkpoint.dir[0] = scfg.checkpoint.inference_model[0] = '\0';
    snprintf(scfg.checkpoint.pretrained, sizeof scfg.checkpoint.pretrained,
             "%s/model.safetensors", dir);
    CHECK_OK(fl_train_setup(&src, &scfg));
    CHECK_OK(fl_train_ckpt_restore(&src, &scfg, &pos));
    /* fc1 fits: taken; fc2 (8, 16) and fc3 (2, 8) do not: left as initialised; fc2.bias (8)
     * does not either; fc3.bias (2) fits */
    const char *taken[] = {"fc1.weight", "fc1.bias", "fc3.bias"};
    const char *kept[] = {"fc2.weight", "fc2.bias", "fc3.weight"};
    for (int i = 0; i < 3; i++) {
        CHECK(same_values(fl_net_find_param(pre.net, taken[i]),
                          fl_net_find_param(src.net, taken[i])));
        CHECK(!same_values(fl_net_find_param(pre.net, taken[i]),
                           fl_net_find_param(fresh.net, taken[i])));
        CHECK(same_values(fl_net_find_param(pre.net, kept[i]),
                          fl_net_find_param(fresh.net, kept[i])));
    }
    fl_train_teardown(&src);
    fl_train_teardown(&pre);
    fl_train_teardown(&fresh);
    /* weights of another model altogether: refused */
    base_config(&cfg);
    cfg.checkpoint.dir[0] = cfg.checkpoint.inference_model[0] = '\0';
    cfg.data.features = 8;
    cfg.model.hidden.v[0] = 4;
    cfg.model.hidden.v[1] = 4;
    cfg.data.classes = 3;
    snprintf(cfg.checkpoint.pretrained, sizeof cfg.checkpoint.pretrained, "%s/ck", dir);
    trainer other = {0};
    CHECK_OK(fl_train_setup(&other, &cfg));
    CHECK_RC(fl_train_ckpt_restore(&other, &cfg, &pos), FL_EFORMAT);
    CHECK_MSG("checkpoint.pretrained");
    CHECK_MSG("no tensor matches");
    fl_train_teardown(&other);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fleet_test_eval_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_eval();
    test_pretrained();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    if (test_failures)
        fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}
