/* test_checkpoint_atomic.c - a writer killed in the middle of replacing a file leaves the
 * previous version whole: a child process rewrites the same 4 MiB safetensors file (and the
 * `latest` pointer) in a loop, each version filled with its own number; the parent SIGKILLs it
 * at random moments, 40 times, and after each kill the file must open (every checksum right)
 * and hold one version throughout, no older than the one before the kill. The checkpoint
 * directory helpers (latest, resolve, prune) are checked here too. */
#include "fleet/checkpoint.h"
#include "fleet/rng.h"
#include "fleet/safetensors.h"
#include "fleet/status.h"
#include "test.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NUMEL (1 << 20) /* 4 MiB of f32 */

static char dir[256], ptr[300]; /* ptr: a root whose `latest` the writer moves too */

/* the child: versions start+1, start+2, ... forever */
static void writer(const char *path, int64_t start) {
    float *v = malloc(NUMEL * sizeof *v);
    int64_t shape[1] = {NUMEL}, ver_shape[1] = {1};
    for (int64_t k = start + 1;; k++) {
        for (int i = 0; i < NUMEL; i++)
            v[i] = (float)k;
        char meta_v[32];
        snprintf(meta_v, sizeof meta_v, "%lld", (long long)k);
        fl_st_entry e[] = {{"w", FL_DTYPE_F32, 1, shape, v}, {"version", FL_DTYPE_I64, 1,
                                                              ver_shape, &k}};
        fl_st_meta m[] = {{"version", meta_v}};
        if (fl_safetensors_write(path, e, 2, m, 1) < 0 || fl_ckpt_set_latest(ptr, k) < 0) {
            fprintf(stderr, "writer: %s\n", fl_errmsg());
            _exit(1);
        }
    }
}

/* opens path and returns the version it holds, or -1 if it is not whole and consistent */
static int64_t check_file(const char *path) {
    fl_safetensors *st;
    if (fl_safetensors_open(path, &st) < 0) {
        fprintf(stderr, "  does not open: %s\n", fl_errmsg());
        return -1;
    }
    const fl_st_tensor *w = fl_safetensors_find(st, "w"), *ver = fl_safetensors_find(st, "version");
    const char *mv = fl_safetensors_meta(st, "version");
    int64_t k = -1;
    if (w && ver && mv && w->numel == NUMEL) {
        memcpy(&k, ver->data, sizeof k);
        const float *f = w->data;
        for (int i = 0; i < NUMEL && k >= 0; i++)
            if (f[i] != (float)k)
                k = -1;
        if (k >= 0 && atoll(mv) != k)
            k = -1;
    }
    fl_safetensors_close(st);
    return k;
}

static void test_kills(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fl_rng r;
    fl_rng_init(&r, (uint64_t)time(NULL), 0);
    int64_t last = 0, last_latest = 0;
    int midsave = 0, versions_seen = 0;
    for (int i = 0; i < 40; i++) {
        pid_t pid = fork();
        if (pid == 0)
            writer(path, last);
        CHECK(pid > 0);
        if (pid <= 0)
            return;
        /* wait for the first version (else nothing is there to keep), then a random moment */
        for (int w = 0; w < 2000 && access(path, F_OK) != 0; w++)
            usleep(1000);
        usleep((useconds_t)(1000 + fl_rng_below(&r, 120000)));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status)); /* killed, not exited with an error */
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)pid);
        midsave += access(tmp, F_OK) == 0; /* the killed writer's unfinished file */
        int64_t k = check_file(path);
        CHECK(k >= last && k > 0);
        if (k < last || k <= 0)
            fprintf(stderr, "kill %d: version %lld after version %lld\n", i, (long long)k,
                    (long long)last);
        versions_seen += k > last;
        if (k > last)
            last = k;
        /* `latest` (moved after each file) is whole and not ahead of the file */
        char resolved[1024], want[1024];
        if (fl_ckpt_resolve(ptr, resolved, sizeof resolved) < 0) {
            /* only acceptable before the first `latest` was ever written (a kill between the
             * first file and its pointer, which a loaded machine makes likely) */
            CHECK(last_latest == 0);
            if (last_latest != 0)
                fprintf(stderr, "kill %d: `latest` lost: %s\n", i, fl_errmsg());
            continue;
        }
        const char *underscore = strrchr(resolved, '_');
        CHECK(underscore != NULL);
        if (!underscore)
            continue;
        int64_t lk = atoll(underscore + 1);
        CHECK(lk <= k && lk >= last_latest);
        last_latest = lk;
        fl_ckpt_step_dir(want, sizeof want, ptr, lk);
        CHECK(strcmp(resolved, want) == 0);
    }
    printf("40 kills: %d left a half-written temporary file, %d new versions, the file whole "
           "after every kill (last version %lld)\n", midsave, versions_seen, (long long)last);
    CHECK(midsave >= 1); /* else the kills never hit a write and proved nothing */
}

static void mkstep(int64_t step) {
    char p[1024], f[1100];
    fl_ckpt_step_dir(p, sizeof p, dir, step);
    CHECK_OK(fl_ckpt_mkdirs(p));
    snprintf(f, sizeof f, "%s/model.safetensors", p);
    CHECK_OK(fl_safetensors_write(f, NULL, 0, NULL, 0));
}

static bool exists(int64_t step) {
    char p[1024];
    fl_ckpt_step_dir(p, sizeof p, dir, step);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_dirs(void) {
    char root[300], out[1024], file[1100];
    snprintf(root, sizeof root, "%s", dir);
    for (int64_t s = 10; s <= 60; s += 10)
        mkstep(s);
    CHECK_OK(fl_ckpt_set_latest(root, 40));
    CHECK_OK(fl_ckpt_resolve(root, out, sizeof out));
    char want[1024];
    fl_ckpt_step_dir(want, sizeof want, root, 40);
    CHECK(strcmp(out, want) == 0);
    /* a step directory resolves to itself */
    CHECK_OK(fl_ckpt_resolve(want, out, sizeof out));
    CHECK(strcmp(out, want) == 0);
    int nfiles;
    CHECK_OK(fl_ckpt_rank_file(want, 1, file, sizeof file, &nfiles));
    CHECK(nfiles == 0 && strstr(file, "/model.safetensors"));
    /* keep 2: 40 (latest) and 30 stay; 50, 60 (after latest: an abandoned run) and 10, 20 go */
    CHECK_OK(fl_ckpt_prune(root, 2));
    CHECK(exists(40) && exists(30) && !exists(50) && !exists(60) && !exists(20) && !exists(10));
    /* rank files */
    char p[1024], f[1100];
    fl_ckpt_step_dir(p, sizeof p, root, 70);
    CHECK_OK(fl_ckpt_mkdirs(p));
    for (int rk = 0; rk < 3; rk++) {
        snprintf(f, sizeof f, "%s/rank_%d.safetensors", p, rk);
        CHECK_OK(fl_safetensors_write(f, NULL, 0, NULL, 0));
    }
    CHECK_OK(fl_ckpt_rank_file(p, 2, file, sizeof file, &nfiles));
    CHECK(nfiles == 3 && strstr(file, "/rank_2.safetensors"));
    /* a damaged pointer and a plain directory are refused, naming the path */
    snprintf(f, sizeof f, "%s/latest", root);
    FILE *fp = fopen(f, "w");
    fputs("step_12x\n", fp);
    fclose(fp);
    CHECK_RC(fl_ckpt_resolve(root, out, sizeof out), FL_EFORMAT);
    CHECK_MSG("is not a step directory name");
    fl_ckpt_step_dir(p, sizeof p, root, 99);
    CHECK_OK(fl_ckpt_mkdirs(p));
    CHECK_RC(fl_ckpt_resolve(p, out, sizeof out), FL_EIO);
    CHECK_MSG("not a checkpoint");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fleet_test_ckpt_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(ptr, sizeof ptr, "%s/ptr", dir);
    CHECK_OK(fl_ckpt_mkdirs(ptr));
    test_kills();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/* && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not empty %s\n", dir);
    test_dirs();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    if (test_failures)
        fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}
