/* fleet-ckpt - looks into fleet's safetensors files: `ls` opens one (which verifies every
 * checksum and byte range) and lists its tensors and metadata; `diff` says whether two files
 * hold the same tensors with the same bytes (how the resume tests compare runs); `merge-ps`
 * makes one model file of a parameter-server job's checkpoint (the servers' shards on the
 * workers' checkpoint) for fleet-eval. Thin: parses arguments and calls the library
 * (include/fleet/checkpoint.h, fl_train_ps_merge in include/fleet/train.h). */
#include "fleet/checkpoint.h"
#include "fleet/safetensors.h"
#include "fleet/status.h"
#include "fleet/train.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: fleet-ckpt ls PATH\n"
            "       fleet-ckpt diff PATH_A PATH_B [--skip PREFIX]\n"
            "       fleet-ckpt merge-ps CKPT_DIR [--step N] --out FILE\n"
            "\n"
            "PATH is a .safetensors file, a checkpoint step directory, or a checkpoint.dir\n"
            "(its `latest`; rank 0's file). ls verifies the file and lists it; diff exits 0\n"
            "when both hold the same tensors, bit for bit (names starting with PREFIX aside),\n"
            "1 when they differ, 2 on errors.\n"
            "merge-ps writes the model of a parameter-server job's checkpoint.dir at step N\n"
            "(default: its `latest`) into FILE, one file fleet-eval -m reads: the network of\n"
            "the workers' checkpoint with the trainable values of the servers' shards, and\n"
            "the sparse tables as ps.sparse.<t>.ids / .values.\n");
}

static int open_path(const char *p, fl_safetensors **st) {
    char path[1100];
    struct stat sb;
    if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
        snprintf(path, sizeof path, "%s", p);
    } else {
        char dir[1024];
        int nfiles;
        FL_TRY(fl_ckpt_resolve(p, dir, sizeof dir));
        FL_TRY(fl_ckpt_rank_file(dir, 0, path, sizeof path, &nfiles));
    }
    return fl_safetensors_open(path, st);
}

static int cmd_ls(const char *p) {
    fl_safetensors *st;
    if (open_path(p, &st) < 0)
        return -1;
    size_t bytes = 0;
    for (int i = 0; i < fl_safetensors_count(st); i++) {
        const fl_st_tensor *t = fl_safetensors_tensor(st, i);
        char s[96];
        printf("%-40s %-4s %s\n", t->name, fl_safetensors_dtype_name(t->dtype),
               fl_shape_str(t->ndim, t->shape, s, sizeof s));
        bytes += t->nbytes;
    }
    for (int i = 0; i < fl_safetensors_meta_count(st); i++) {
        const char *k, *v;
        fl_safetensors_meta_at(st, i, &k, &v);
        if (strncmp(k, "crc32.", 6) && !strchr(v, '\n'))
            printf("meta %s: %s\n", k, v);
    }
    printf("%s: %d tensors, %zu bytes of data, checksums %s\n", fl_safetensors_path(st),
           fl_safetensors_count(st), bytes,
           fl_safetensors_has_checksums(st) ? "verified" : "absent");
    fl_safetensors_close(st);
    return 0;
}

static int cmd_diff(const char *pa, const char *pb, const char *skip) {
    fl_safetensors *a, *b;
    if (open_path(pa, &a) < 0)
        return -1;
    if (open_path(pb, &b) < 0) {
        fl_safetensors_close(a);
        return -1;
    }
    int ndiff = 0, nsame = 0;
    for (int pass = 0; pass < 2; pass++) {
        fl_safetensors *x = pass ? b : a, *y = pass ? a : b;
        for (int i = 0; i < fl_safetensors_count(x); i++) {
            const fl_st_tensor *t = fl_safetensors_tensor(x, i);
            if (skip && !strncmp(t->name, skip, strlen(skip)))
                continue;
            const fl_st_tensor *u = fl_safetensors_find(y, t->name);
            if (!u) {
                printf("only in %s: %s\n", fl_safetensors_path(x), t->name);
                ndiff++;
            } else if (pass == 0) {
                if (t->dtype != u->dtype || t->nbytes != u->nbytes ||
                    memcmp(t->data, u->data, t->nbytes) != 0) {
                    printf("differs: %s\n", t->name);
                    ndiff++;
                } else {
                    nsame++;
                }
            }
        }
    }
    printf("%d tensors identical, %d differ\n", nsame, ndiff);
    fl_safetensors_close(a);
    fl_safetensors_close(b);
    return ndiff ? 1 : 0;
}

static int cmd_merge_ps(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    int64_t step = -1;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--step") && i + 1 < argc) {
            char *end;
            errno = 0;
            long long v = strtoll(argv[++i], &end, 10);
            if (errno || end == argv[i] || *end || v < 0) {
                fprintf(stderr, "fleet-ckpt: error: --step '%s': a step number >= 0\n", argv[i]);
                return 2;
            }
            step = v;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!dir && argv[i][0] != '-') {
            dir = argv[i];
        } else {
            fprintf(stderr, "fleet-ckpt: error: merge-ps: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || !out) {
        fprintf(stderr, "fleet-ckpt: error: merge-ps needs CKPT_DIR and --out FILE\n");
        usage(stderr);
        return 2;
    }
    fl_train_ps_merge_report r;
    if (fl_train_ps_merge(dir, step, out, &r) < 0)
        return -1;
    char applied[64];
    if (r.version_min == r.version_max)
        snprintf(applied, sizeof applied, "%" PRId64, r.version_min);
    else /* async: servers a push apart */
        snprintf(applied, sizeof applied, "%" PRId64 "..%" PRId64, r.version_min, r.version_max);
    printf("fleet-ckpt: step %" PRId64 " of %d server(s): %" PRId64 " trainable values (dense "
           "table 0, %s updates applied) on the network of %s\n", r.step, r.servers,
           r.trainable, applied, r.template_path);
    if (r.dense_tables || r.sparse_tables)
        printf("fleet-ckpt: %d more dense table(s), %d sparse table(s) with %" PRId64 " rows\n",
               r.dense_tables, r.sparse_tables, r.sparse_rows);
    printf("fleet-ckpt: wrote %s\n", out);
    return 0;
}

int main(int argc, char **argv) {
    int rc;
    if (argc >= 2 && !strcmp(argv[1], "merge-ps")) {
        rc = cmd_merge_ps(argc, argv);
        if (rc == 2)
            return 2;
    } else if (argc == 3 && !strcmp(argv[1], "ls")) {
        rc = cmd_ls(argv[2]);
    } else if ((argc == 4 || (argc == 6 && !strcmp(argv[4], "--skip"))) &&
               !strcmp(argv[1], "diff")) {
        rc = cmd_diff(argv[2], argv[3], argc == 6 ? argv[5] : NULL);
    } else if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    } else {
        usage(stderr);
        return 2;
    }
    if (rc < 0) {
        fprintf(stderr, "fleet-ckpt: error: %s\n", fl_errmsg());
        return 2;
    }
    return rc;
}
