/* jpeg_pipeline.c - images per second of the ImageNet training pipeline (read + decode +
 * random resized crop + flip + normalise to 3 x 224 x 224) beside libjpeg-turbo's decode-only
 * speed on the same JPEGs, on 1 thread and through the prefetching loader's worker threads.
 * Usage: jpeg_pipeline DIR [IMAGES] [ROUNDS]  -- makes DIR/list.txt and IMAGES JPEGs of
 * 500 x 375 at quality 90 there if missing, then prints one line per measurement:
 *   <what> <threads> <median img/s> <min img/s> <max img/s> <median img per CPU-second>
 * The last is images over the process's CPU time (all threads): per-core throughput that other
 * jobs on a shared machine disturb much less than wall-clock rates. */
#include "fleet/data.h"
#include "fleet/image.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "bench_time.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* A photo-like image: smooth colour fields, a few soft-edged blobs, and sensor-like noise, so
 * the files are about the size of ImageNet's at quality 90. */
static void make_image(fl_image *im, int i) {
    fl_rng r;
    fl_rng_init(&r, 2026, (uint64_t)i);
    double f[6];
    for (int k = 0; k < 6; k++)
        f[k] = 0.005 + 0.05 * fl_rng_uniform_f64(&r);
    double bx[4], by[4], br[4];
    for (int k = 0; k < 4; k++)
        bx[k] = 500 * fl_rng_uniform_f64(&r), by[k] = 375 * fl_rng_uniform_f64(&r),
        br[k] = 20 + 80 * fl_rng_uniform_f64(&r);
    for (int y = 0; y < im->h; y++)
        for (int x = 0; x < im->w; x++) {
            double blob = 0;
            for (int k = 0; k < 4; k++) {
                double d = hypot(x - bx[k], y - by[k]) / br[k];
                blob += d < 1 ? 60 * (1 - d * d) : 0;
            }
            for (int c = 0; c < 3; c++) {
                double v = 110 + 50 * sin(f[c] * x + f[c + 3] * y + c) + blob * (c == i % 3) +
                           18 * fl_rng_normal(&r);
                v = v < 0 ? 0 : v > 255 ? 255 : v;
                im->data[((size_t)y * im->w + x) * 3 + c] = (uint8_t)v;
            }
        }
}

/* Wall-clock and CPU rates of the last measurement. */
static double cpu_rate;

static int make_tree(const char *dir, int n) {
    char path[512];
    snprintf(path, sizeof path, "%s/list.txt", dir);
    struct stat st;
    if (stat(path, &st) == 0)
        return 0;
    mkdir(dir, 0755);
    FILE *list = fopen(path, "w");
    if (!list)
        return fl_fail(FL_EIO, "%s: cannot create", path);
    fl_image im;
    FL_TRY(fl_image_alloc(&im, 500, 375, 3));
    for (int i = 0; i < n; i++) {
        make_image(&im, i);
        snprintf(path, sizeof path, "%s/img%04d.jpeg", dir, i);
        int rc = fl_jpeg_write(path, &im, 90);
        if (rc < 0) {
            fl_image_free(&im);
            fclose(list);
            return rc;
        }
        fprintf(list, "img%04d.jpeg %d\n", i, i % 1000);
    }
    fl_image_free(&im);
    fclose(list);
    return 0;
}

typedef struct {
    uint8_t **bufs;
    size_t   *lens;
    int       lo, hi;
} decode_job;

static void *decode_range(void *arg) {
    decode_job *j = arg;
    for (int i = j->lo; i < j->hi; i++) {
        fl_image im;
        if (fl_jpeg_decode(j->bufs[i], j->lens[i], 0, 0, &im, NULL) < 0)
            abort();
        fl_image_free(&im);
    }
    return NULL;
}

/* Decode-only, full size, from memory, on `threads` threads splitting the images. */
static double decode_only(uint8_t **bufs, size_t *lens, int n, int threads) {
    pthread_t th[16];
    decode_job jobs[16];
    double t0 = bench_wall_s(), c0 = bench_cpu_s();
    for (int t = 0; t < threads; t++) {
        jobs[t] = (decode_job){bufs, lens, n * t / threads, n * (t + 1) / threads};
        pthread_create(&th[t], NULL, decode_range, &jobs[t]);
    }
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    cpu_rate = n / (bench_cpu_s() - c0);
    return n / (bench_wall_s() - t0);
}

/* The full training pipeline through the loader: workers = 0 makes samples on this thread. */
static double pipeline(fl_dataset *ds, int workers, int64_t epoch) {
    fl_prefetch_config pc = {.base = {.batch_size = 25, .shuffle = true, .seed = 1, .world = 1},
                             .num_workers = workers, .prefetch = 4};
    double t0 = bench_wall_s(), c0 = bench_cpu_s();
    fl_prefetch *p = fl_prefetch_create(ds, &pc);
    if (!p || fl_prefetch_seek(p, epoch, 0) < 0) {
        fprintf(stderr, "jpeg_pipeline: %s\n", fl_errmsg());
        exit(1);
    }
    const fl_tensor *x;
    const int32_t *y;
    int64_t n = 0;
    int rc;
    while ((rc = fl_prefetch_next(p, &x, &y)) == 1)
        n += x->shape[0];
    if (rc < 0 || n != ds->size) {
        fprintf(stderr, "jpeg_pipeline: %s (%lld of %lld images)\n", fl_errmsg(), (long long)n,
                (long long)ds->size);
        exit(1);
    }
    fl_prefetch_free(p);
    cpu_rate = n / (bench_cpu_s() - c0);
    return n / (bench_wall_s() - t0);
}

static void report(const char *what, int threads, double *v, double *cpu, int rounds) {
    qsort(v, (size_t)rounds, sizeof *v, bench_cmp_double);
    qsort(cpu, (size_t)rounds, sizeof *cpu, bench_cmp_double);
    printf("%s %d %.1f %.1f %.1f %.1f\n", what, threads, v[rounds / 2], v[0], v[rounds - 1],
           cpu[rounds / 2]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: jpeg_pipeline DIR [IMAGES=200] [ROUNDS=5]\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 200, rounds = argc > 3 ? atoi(argv[3]) : 5;
    if (n < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "jpeg_pipeline: bad IMAGES or ROUNDS\n");
        return 2;
    }
    if (make_tree(dir, n) < 0) {
        fprintf(stderr, "jpeg_pipeline: %s\n", fl_errmsg());
        return 1;
    }
    char list[512];
    snprintf(list, sizeof list, "%s/list.txt", dir);
    fl_imagelist_config c = fl_imagelist_config_default();
    c.list = list;
    c.root = dir;
    c.on_bad_image = FL_BAD_IMAGE_FAIL;
    fl_dataset *ds = fl_dataset_imagelist_create(&c);
    if (!ds) {
        fprintf(stderr, "jpeg_pipeline: %s\n", fl_errmsg());
        return 1;
    }
    n = (int)ds->size;
    uint8_t **bufs = calloc((size_t)n, sizeof *bufs);
    size_t *lens = calloc((size_t)n, sizeof *lens), total = 0;
    for (int i = 0; i < n; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/img%04d.jpeg", dir, i);
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "jpeg_pipeline: %s: cannot open\n", path);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        lens[i] = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        bufs[i] = malloc(lens[i]);
        if (fread(bufs[i], 1, lens[i], f) != lens[i])
            return 1;
        fclose(f);
        total += lens[i];
    }
    printf("# %d JPEGs of 500 x 375, quality 90, mean %.1f KB\n", n, total / 1024.0 / n);
    double v[64], cpu[64];
    pipeline(ds, 0, 99); /* warm the page cache and the allocator */
    for (int threads = 1; threads <= 2; threads++) {
        for (int r = 0; r < rounds; r++) {
            v[r] = decode_only(bufs, lens, n, threads);
            cpu[r] = cpu_rate;
        }
        report("decode_only", threads, v, cpu, rounds);
        for (int r = 0; r < rounds; r++) {
            v[r] = pipeline(ds, threads == 1 ? 0 : threads, r);
            cpu[r] = cpu_rate;
        }
        report(threads == 1 ? "pipeline_inline" : "pipeline_workers", threads, v, cpu, rounds);
    }
    for (int r = 0; r < rounds; r++) {
        v[r] = pipeline(ds, 1, r);
        cpu[r] = cpu_rate;
    }
    report("pipeline_workers", 1, v, cpu, rounds);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    fl_dataset_free(ds);
    return 0;
}
