/* fleet-train - the trainer: fleet-train -c CONFIG [-o key=value ...], one process per worker
 * (fleetrun or mpirun start several; alone it is a job of one).
 * Thin: parses arguments, loads the configuration, and calls fl_train_run. */
#include "fleet/backend.h"
#include "fleet/config.h"
#include "fleet/status.h"
#include "fleet/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OVERRIDES 128

static void usage(FILE *out) {
    fprintf(out,
            "usage: fleet-train -c CONFIG [-o key=value ...] [--resume DIR] [--print-config]\n"
            "                   [--print-model]\n"
            "       fleet-train --help-config\n"
            "\n"
            "  -c, --config FILE    YAML configuration (see configs/ and docs/config.md)\n"
            "  -o key=value         override a key, e.g. -o optimizer.lr.base=0.05\n"
            "                       (lists as YAML: -o model.hidden=[256,256])\n"
            "  --resume DIR         continue from a checkpoint: a step directory, or the\n"
            "                       checkpoint.dir whose `latest` names one (docs/checkpoint.md)\n"
            "  --print-config       print the effective configuration and exit\n"
            "  --print-model        print the model's layers (the names strategy.recompute's\n"
            "                       checkpoints take), output shapes, parameters and\n"
            "                       activation memory at train.batch_size, and exit\n"
            "  --help-config        list every configuration key with its help\n"
            "  -h, --help           this text\n"
            "\n"
            "Exit status: 0 done; 2 an error in the job (arguments, configuration, data, model,\n"
            "a checkpoint it cannot resume from: before training began); 1 a failure during\n"
            "training (a dead peer, a non-finite loss, a full disk).\n"
            "\n"
            "Distributed: fleetrun --nproc_per_node 2 fleet-train -c CONFIG, or\n"
            "             mpirun -np 2 fleet-train -c CONFIG -o comm.backend=mpi\n");
}

static void help_config(void) {
    int n;
    const fl_cfg_key *keys = fl_train_schema(&n);
    int width = 0;
    for (int i = 0; i < n; i++)
        if ((int)strlen(keys[i].path) > width)
            width = (int)strlen(keys[i].path);
    for (int i = 0; i < n; i++) {
        printf("%-*s  %s", width, keys[i].path, keys[i].help);
        if (keys[i].choices)
            printf(" (%s)", keys[i].choices);
        printf("\n");
    }
}

int main(int argc, char **argv) {
    fl_kernels_wait_default(argv); /* spin briefly, then sleep (unless the environment says) */
    const char *config_path = NULL;
    const char *overrides[MAX_OVERRIDES];
    int noverrides = 0;
    int print_config = 0, print_model = 0;
    const char *resume = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-c") || !strcmp(a, "--config")) && i + 1 < argc) {
            config_path = argv[++i];
        } else if (!strcmp(a, "-o") && i + 1 < argc) {
            if (noverrides == MAX_OVERRIDES) {
                fprintf(stderr, "fleet-train: error: more than %d -o overrides\n", MAX_OVERRIDES);
                return 2;
            }
            overrides[noverrides++] = argv[++i];
        } else if (!strcmp(a, "--resume") && i + 1 < argc) {
            resume = argv[++i];
        } else if (!strcmp(a, "--print-config")) {
            print_config = 1;
        } else if (!strcmp(a, "--print-model")) {
            print_model = 1;
        } else if (!strcmp(a, "--help-config")) {
            help_config();
            return 0;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "fleet-train: error: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!config_path) {
        fprintf(stderr, "fleet-train: error: no configuration given\n"
                        "hint: fleet-train -c configs/quickstart.yaml\n");
        return 2;
    }

    fl_train_config cfg;
    int rc = fl_train_config_load(&cfg, config_path, overrides, noverrides);
    if (rc < 0) {
        fprintf(stderr, "fleet-train: error: %s\n", fl_errmsg());
        if (rc == FL_EUNSUPPORTED)
            fprintf(stderr, "hint: docs/config.md says which strategy keys work in this version\n");
        else
            fprintf(stderr, "hint: fleet-train --help-config lists every key\n");
        return 2;
    }
    if (resume) {
        if (strlen(resume) >= sizeof cfg.checkpoint.resume) {
            fprintf(stderr, "fleet-train: error: --resume: path longer than %zu bytes\n",
                    sizeof cfg.checkpoint.resume - 1);
            return 2;
        }
        snprintf(cfg.checkpoint.resume, sizeof cfg.checkpoint.resume, "%s", resume);
    }
    if (print_config) {
        int n;
        const fl_cfg_key *keys = fl_train_schema(&n);
        fl_config_print(keys, n, &cfg, stdout);
        return 0;
    }
    if (print_model) {
        if (fl_train_print_model(&cfg, stdout) < 0) {
            fprintf(stderr, "fleet-train: error: %s\n", fl_errmsg());
            return 1;
        }
        return 0;
    }
    fl_train_result res;
    if (fl_train_run(&cfg, &res) < 0) {
        fprintf(stderr, "fleet-train: error: %s\n", fl_errmsg());
        /* 2: an error in the job itself (it failed before training began), which fleetrun
         * --max_restarts does not restart; 1: a failure during training */
        return res.started ? 1 : 2;
    }
    return 0;
}
