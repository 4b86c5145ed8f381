/* fleet-eval - offline evaluation (seed 002's evaluation program): runs a model saved by
 * fleet-train (checkpoint.inference_model, or a checkpoint) over a dataset with the evaluation
 * transforms and writes the output vectors as .npy, for comparison with a deployed service.
 * Thin: parses arguments and calls fl_infer_run (include/fleet/infer.h). */
#include "fleet/backend.h"
#include "fleet/infer.h"
#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_OVERRIDES 128

static void usage(FILE *out) {
    fprintf(out,
            "usage: fleet-eval -m MODEL [-c CONFIG] [-o key=value ...] [--split val|train]\n"
            "                  [--out LOGITS.npy] [--inputs INPUTS.npy] [--form auto|fused|train]\n"
            "\n"
            "  -m, --model PATH     inference model (checkpoint.inference_model) or checkpoint\n"
            "  -c, --config FILE    YAML whose data section names the samples (e.g. an image\n"
            "                       list); default: the training configuration in MODEL\n"
            "  -o key=value         override a key (data.*, train.batch_size, ...)\n"
            "  --split val|train    which split of the data (default val)\n"
            "  --out FILE.npy       output vectors (N, classes) as float32\n"
            "  --inputs FILE.npy    also the input samples, flattened (N, features)\n"
            "  --form auto|fused|train  which form of the network runs: pplcnetv2's\n"
            "                       re-parameterised (fused) inference form, or the training\n"
            "                       form (default auto: fused where the model has one)\n"
            "  -h, --help           this text\n"
            "\n"
            "Prints samples, loss, top-1 and top-5 accuracy when the samples have labels; for\n"
            "a CTR model (wide_deep, deepfm) AUC, log loss, predicted and actual CTR.\n");
}

int main(int argc, char **argv) {
    fl_kernels_wait_default(argv); /* spin briefly, then sleep (unless the environment says) */
    fl_infer_args a = {.split = 1};
    const char *overrides[MAX_OVERRIDES];
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        int more = i + 1 < argc;
        if ((!strcmp(s, "-m") || !strcmp(s, "--model")) && more) {
            a.model = argv[++i];
        } else if ((!strcmp(s, "-c") || !strcmp(s, "--config")) && more) {
            a.config = argv[++i];
        } else if (!strcmp(s, "-o") && more) {
            if (a.noverrides == MAX_OVERRIDES) {
                fprintf(stderr, "fleet-eval: error: more than %d -o overrides\n", MAX_OVERRIDES);
                return 2;
            }
            overrides[a.noverrides++] = argv[++i];
        } else if (!strcmp(s, "--split") && more) {
            const char *v = argv[++i];
            if (strcmp(v, "val") && strcmp(v, "train")) {
                fprintf(stderr, "fleet-eval: error: --split '%s': val or train\n", v);
                return 2;
            }
            a.split = !strcmp(v, "val");
        } else if (!strcmp(s, "--out") && more) {
            a.out_npy = argv[++i];
        } else if (!strcmp(s, "--inputs") && more) {
            a.inputs_npy = argv[++i];
        } else if (!strcmp(s, "--form") && more) {
            const char *v = argv[++i];
            if (!strcmp(v, "auto"))
                a.form = FL_INFER_FORM_AUTO;
            else if (!strcmp(v, "fused"))
                a.form = FL_INFER_FORM_FUSED;
            else if (!strcmp(v, "train"))
                a.form = FL_INFER_FORM_TRAIN;
            else {
                fprintf(stderr, "fleet-eval: error: --form '%s': auto, fused or train\n", v);
                return 2;
            }
        } else if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "fleet-eval: error: unexpected argument '%s'\n", s);
            usage(stderr);
            return 2;
        }
    }
    if (!a.model) {
        fprintf(stderr, "fleet-eval: error: no model given\n"
                        "hint: train with -o checkpoint.inference_model=model.safetensors, then "
                        "fleet-eval -m model.safetensors --out logits.npy\n");
        return 2;
    }
    a.overrides = overrides;
    fl_infer_result r;
    if (fl_infer_run(&a, &r) < 0) {
        fprintf(stderr, "fleet-eval: error: %s\n", fl_errmsg());
        return 1;
    }
    if (r.ctr) { /* a CTR model: AUC and log loss (docs/ctr.md) */
        printf("fleet-eval: CTR model, %lld dense parameters, %lld sparse rows\n",
               (long long)r.params, (long long)r.table_rows);
        printf("fleet-eval: %lld samples, auc %.6f, logloss %.6f, pred_ctr %.6f, ctr %.6f\n",
               (long long)r.samples, r.auc, r.logloss, r.pred_ctr, r.actual_ctr);
        return 0;
    }
    if (r.fused)
        printf("fleet-eval: network: re-parameterised (fused) inference form, %lld parameters "
               "(training form %lld)\n", (long long)r.params, (long long)r.train_params);
    else
        printf("fleet-eval: network: training form, %lld parameters\n", (long long)r.params);
    printf("fleet-eval: %lld samples, %lld classes", (long long)r.samples,
           (long long)r.classes);
    if (r.labelled) {
        printf(", loss %.6f, top1 %.6f", r.loss, r.top1);
        if (!isnan(r.top5))
            printf(", top5 %.6f", r.top5);
    } else {
        printf(" (unlabelled: no accuracy)");
    }
    printf("\n");
    if (a.out_npy)
        printf("fleet-eval: logits (%lld, %lld) float32 written to %s\n", (long long)r.samples,
               (long long)r.classes, a.out_npy);
    return 0;
}
