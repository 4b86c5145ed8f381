/* test_criteo.c - the reader of Criteo's text format: files written from ctr_synth read back
 * as the same samples (with and without the prefetch thread, and again after a rewind); each
 * kind of malformed line named with file:line, or skipped and counted; empty fields; the
 * file list's errors; and sharding by files (Paddle's get_file_shard) and by lines covering
 * every line once over worlds of 1 to 3. */
#include "fleet/ctr.h"
#include "fleet/status.h"
#include "test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void write_text(const char *name, const char *text) {
    FILE *f = fopen(path_of(name), "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Appends batch b's samples to all. */
static void append(fl_ctr_batch *all, const fl_ctr_batch *b) {
    for (int64_t i = 0; i < b->batch; i++) {
        int32_t counts[FL_CTR_MAX_SLOTS];
        for (int s = 0; s < b->nslots; s++)
            counts[s] = (int32_t)(b->offsets[i * b->nslots + s + 1] - b->offsets[i * b->nslots + s]);
        CHECK_OK(fl_ctr_batch_add(all, b->labels[i], b->dense + i * b->ndense,
                                  b->ids + b->offsets[i * b->nslots], counts));
    }
}

static int batches_equal(const fl_ctr_batch *a, const fl_ctr_batch *b) {
    int64_t n = fl_ctr_batch_nids(a);
    return a->batch == b->batch && n == fl_ctr_batch_nids(b) &&
           !memcmp(a->labels, b->labels, (size_t)a->batch * sizeof *a->labels) &&
           !memcmp(a->dense, b->dense, (size_t)(a->batch * a->ndense) * sizeof *a->dense) &&
           !memcmp(a->offsets, b->offsets, (size_t)(a->batch * a->nslots + 1) * 8) &&
           !memcmp(a->ids, b->ids, (size_t)n * sizeof *a->ids);
}

/* Reads a whole pass into all; returns the number of batches, or the error. */
static int read_all(fl_criteo_reader *r, fl_ctr_batch *all, int64_t max_batch) {
    const fl_ctr_batch *b;
    int rc, n = 0;
    while ((rc = fl_criteo_next(r, &b)) == 1) {
        CHECK(b->batch <= max_batch);
        append(all, b);
        n++;
    }
    return rc < 0 ? rc : n;
}

static void write_synth(const fl_ctr_synth *s, const char *name, int64_t from, int64_t to) {
    FILE *f = fopen(path_of(name), "w");
    CHECK(f != NULL);
    size_t cap = fl_ctr_synth_line_max(s);
    char *line = malloc(cap);
    for (int64_t i = from; f && i < to; i++) {
        CHECK(fl_ctr_synth_line(s, i, line, cap, NULL) > 0);
        fprintf(f, "%s\n", line);
    }
    free(line);
    if (f)
        fclose(f);
}

static void test_generated(void) {
    fl_ctr_synth_config sc = fl_ctr_synth_config_default();
    sc.vocab = 5000;
    sc.max_ids = 2;
    sc.missing = 0.2;
    fl_ctr_synth *s = fl_ctr_synth_create(&sc);
    CHECK(s != NULL);
    if (!s)
        return;
    write_synth(s, "a.txt", 0, 7);
    write_synth(s, "b.txt", 7, 12);
    write_text("c.txt", "");
    write_text("gen.list", "# the generated set\na.txt\n\n  b.txt  \nc.txt\n");
    fl_ctr_batch want, got;
    CHECK_OK(fl_ctr_batch_init(&want, 13, 26, 1, 1));
    CHECK_OK(fl_ctr_batch_init(&got, 13, 26, 1, 1));
    for (int64_t i = 0; i < 12; i++)
        CHECK_OK(fl_ctr_synth_add(s, i, &want, NULL));
    fl_criteo_config c = fl_criteo_config_default();
    c.file_list = path_of("gen.list");
    c.format.missing_id = false;
    c.batch_size = 4;
    for (int pf = 0; pf < 2; pf++) {
        c.prefetch = pf;
        fl_criteo_reader *r = fl_criteo_open(&c);
        CHECK(r != NULL);
        if (!r)
            continue;
        for (int pass = 0; pass < 2; pass++) {
            fl_ctr_batch_clear(&got);
            CHECK(read_all(r, &got, 4) == 3);
            CHECK(batches_equal(&got, &want));
            const fl_ctr_batch *b;
            CHECK(fl_criteo_next(r, &b) == 0); /* stays at the end */
            CHECK_OK(fl_criteo_rewind(r));
        }
        fl_criteo_stats st;
        fl_criteo_get_stats(r, &st);
        CHECK(st.lines == 24 && st.samples == 24 && st.skipped == 0 && st.files == 3);
        fl_criteo_close(r);
    }
    /* the files given directly; missing ids on: every empty bag holds its slot's missing id */
    const char *files[2] = {path_of("a.txt"), path_of("b.txt")};
    c.file_list = NULL;
    c.files = files;
    c.nfiles = 2;
    c.format.missing_id = true;
    fl_criteo_reader *r = fl_criteo_open(&c);
    CHECK(r != NULL);
    fl_ctr_batch_clear(&got);
    CHECK(r && read_all(r, &got, 4) == 3);
    int64_t empty = 0, wrong = 0;
    for (int64_t i = 0; i < want.batch; i++)
        for (int k = 0; k < 26; k++) {
            int64_t nw, ng;
            const uint64_t *w = fl_ctr_bag(&want, i, k, &nw), *g = fl_ctr_bag(&got, i, k, &ng);
            if (nw == 0) {
                empty++;
                wrong += ng != 1 || g[0] != fl_ctr_id(k, fl_ctr_hash("", 0));
            } else {
                wrong += ng != nw || memcmp(w, g, (size_t)nw * 8) != 0;
            }
        }
    CHECK(empty > 0 && wrong == 0);
    fl_criteo_close(r);
    fl_ctr_batch_free(&want);
    fl_ctr_batch_free(&got);
    fl_ctr_synth_free(s);
}

/* A good line: label 1, I1..I13 = 1..13, C1..C26 = "a0".."a25" in hex ("a0".."b9"). */
static void good_line(char *buf, size_t cap) {
    int o = snprintf(buf, cap, "1");
    for (int j = 1; j <= 13; j++)
        o += snprintf(buf + o, cap - (size_t)o, "\t%d", j);
    for (int k = 0; k < 26; k++)
        o += snprintf(buf + o, cap - (size_t)o, "\t%x", 0xa0 + k);
}

/* good with field `field` (0-based) replaced by `value` */
static void line_with(char *buf, size_t cap, int field, const char *value) {
    char g[512], *p = g;
    good_line(g, sizeof g);
    int o = 0;
    for (int f = 0; f < 40; f++) {
        char *tab = strchr(p, '\t');
        size_t n = tab ? (size_t)(tab - p) : strlen(p);
        o += snprintf(buf + o, cap - (size_t)o, "%s%.*s", f ? "\t" : "", (int)(f == field ? strlen(value) : n),
                      f == field ? value : p);
        p = tab ? tab + 1 : p + n;
    }
}

static void test_broken(void) {
    struct {
        char        line[600];
        const char *want;
    } bad[9];
    char g[512];
    good_line(g, sizeof g);
    int nb = 0;
    snprintf(bad[nb].line, sizeof bad[nb].line, "%.*s", (int)(strrchr(g, '\t') - g), g);
    bad[nb++].want = "39 fields, want 40";
    snprintf(bad[nb].line, sizeof bad[nb].line, "%s\tff", g);
    bad[nb++].want = "41 fields, want 40";
    line_with(bad[nb].line, sizeof bad[nb].line, 2, "1.5");
    bad[nb++].want = "field 3 (I2): '1.5' is not an integer";
    line_with(bad[nb].line, sizeof bad[nb].line, 13, "99999999999999999999");
    bad[nb++].want = "field 14 (I13)";
    line_with(bad[nb].line, sizeof bad[nb].line, 14, "zz");
    bad[nb++].want = "field 15 (C1): 'zz' is not hexadecimal";
    line_with(bad[nb].line, sizeof bad[nb].line, 39, "ab,,cd");
    bad[nb++].want = "field 40 (C26): 'ab,,cd' is not hexadecimal (an empty value";
    line_with(bad[nb].line, sizeof bad[nb].line, 0, "2");
    bad[nb++].want = "label '2' is not 0 or 1";
    line_with(bad[nb].line, sizeof bad[nb].line, 0, "");
    bad[nb++].want = "label '' is not 0 or 1";
    line_with(bad[nb].line, sizeof bad[nb].line, 5, "-");
    bad[nb++].want = "field 6 (I5): '-' is not an integer";

    fl_criteo_config c = fl_criteo_config_default();
    const char *one[1] = {path_of("bad.txt")};
    c.files = one;
    c.nfiles = 1;
    c.batch_size = 2;
    for (int k = 0; k < nb; k++) {
        char text[8192];
        snprintf(text, sizeof text, "%s\n%s\r\n%s\n%s\n", g, g, bad[k].line, g);
        write_text("bad.txt", text);
        fl_criteo_reader *r = fl_criteo_open(&c);
        CHECK(r != NULL);
        if (!r)
            continue;
        const fl_ctr_batch *b;
        CHECK(fl_criteo_next(r, &b) == 1 && b->batch == 2); /* lines 1-2, the CRLF one too */
        CHECK_RC(fl_criteo_next(r, &b), FL_EFORMAT);
        char want[256];
        snprintf(want, sizeof want, "%s:3: ", one[0]);
        CHECK_MSG(want);
        CHECK_MSG(bad[k].want);
        CHECK_RC(fl_criteo_next(r, &b), FL_EFORMAT); /* and again */
        CHECK_MSG(bad[k].want);
        fl_criteo_close(r);
    }
    /* skip: every bad kind between good lines, counted */
    char *text = malloc(32768);
    int o = 0;
    for (int k = 0; k < nb; k++)
        o += snprintf(text + o, 32768 - (size_t)o, "%s\n%s\n", g, bad[k].line);
    write_text("bad.txt", text);
    free(text);
    c.bad_lines = FL_BAD_LINES_SKIP;
    c.batch_size = 4;
    fl_criteo_reader *r = fl_criteo_open(&c);
    fl_ctr_batch all;
    CHECK_OK(fl_ctr_batch_init(&all, 13, 26, 1, 1));
    CHECK(r && read_all(r, &all, 4) == (2 * nb + 3) / 4);
    fl_criteo_stats st;
    if (r)
        fl_criteo_get_stats(r, &st);
    CHECK(r && st.skipped == nb && st.samples == nb && st.lines == 2 * nb);
    CHECK(all.batch == nb);
    fl_criteo_close(r);
    fl_ctr_batch_free(&all);
}

static void test_fields(void) {
    fl_criteo_format f = fl_criteo_format_default();
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, 13, 26, 1, 1));
    char empty[64];
    memset(empty, '\t', 39);
    empty[0] = '0';
    empty[39] = '\t';
    CHECK_OK(fl_criteo_parse_line(&f, empty, 40, &b)); /* "0" + 39 tabs = 40 empty-ish fields */
    CHECK(b.batch == 1 && b.labels[0] == 0);
    int zeros = 1;
    for (int j = 0; j < 13; j++)
        zeros &= b.dense[j] == 0.0f;
    CHECK(zeros);
    CHECK(fl_ctr_batch_nids(&b) == 26);
    for (int k = 0; k < 26; k++) {
        int64_t n;
        const uint64_t *ids = fl_ctr_bag(&b, 0, k, &n);
        CHECK(n == 1 && ids[0] == fl_ctr_id(k, fl_ctr_hash("", 0)));
    }
    f.missing_id = false;
    CHECK_OK(fl_criteo_parse_line(&f, empty, 40, &b));
    CHECK(b.batch == 2 && fl_ctr_batch_nids(&b) == 26);
    /* transforms and multi-valued fields */
    char line[600];
    line_with(line, sizeof line, 2, "-3");
    char *c26 = strrchr(line, '\t') + 1;
    strcpy(c26, "1f,1F,0");
    fl_ctr_batch_clear(&b);
    f = fl_criteo_format_default();
    CHECK_OK(fl_criteo_parse_line(&f, line, strlen(line), &b));
    CHECK(b.dense[0] == (float)(1.0 / 20)); /* (1 - 0) / 20 */
    CHECK(b.dense[1] == 0.0f);              /* (-3 - -3) / 603 */
    CHECK(b.dense[4] == (float)(5.0 / 64000));
    int64_t n;
    const uint64_t *ids = fl_ctr_bag(&b, 0, 25, &n);
    CHECK(n == 3 && ids[0] == fl_ctr_id(25, fl_ctr_hash("1f", 2)) &&
          ids[1] == fl_ctr_id(25, fl_ctr_hash("1F", 2)) && ids[1] != ids[0] &&
          ids[2] == fl_ctr_id(25, fl_ctr_hash("0", 1)));
    ids = fl_ctr_bag(&b, 0, 0, &n);
    CHECK(n == 1 && ids[0] == fl_ctr_id(0, fl_ctr_hash("a0", 2)) && fl_ctr_id_slot(ids[0]) == 0);
    f.transform = FL_CTR_DENSE_LOG;
    CHECK_OK(fl_criteo_parse_line(&f, line, strlen(line), &b));
    CHECK(b.dense[13 + 1] == (float)-log1p(3.0) && b.dense[13 + 12] == (float)log1p(13.0));
    /* a bad line leaves the batch as it was */
    int64_t nids = fl_ctr_batch_nids(&b);
    line_with(line, sizeof line, 30, "xyz");
    CHECK_RC(fl_criteo_parse_line(&f, line, strlen(line), &b), FL_EFORMAT);
    CHECK(b.batch == 2 && fl_ctr_batch_nids(&b) == nids);
    /* the hash: fixed values, so ids are the same on every machine */
    CHECK(fl_ctr_hash("", 0) == fl_ctr_hash("", 0) && fl_ctr_hash("68fd1e64", 8) != fl_ctr_hash("68fd1e65", 8));
    CHECK(fl_ctr_hash("68fd1e64", 8) <= FL_CTR_HASH_MASK);
    f.ndense = 5;
    f.transform = FL_CTR_DENSE_MINMAX;
    CHECK_RC(fl_criteo_format_check(&f), FL_EINVAL); /* log is fine with 5 */
    f.transform = FL_CTR_DENSE_LOG;
    CHECK_OK(fl_criteo_format_check(&f));
    fl_ctr_batch_free(&b);
}

static void test_list_errors(void) {
    fl_criteo_config c = fl_criteo_config_default();
    write_text("ok.txt", "");
    write_text("missing.list", "ok.txt\n# fine\nnot-there.txt\n");
    c.file_list = path_of("missing.list");
    CHECK(fl_criteo_open(&c) == NULL);
    CHECK_MSG("missing.list:3: ");
    CHECK_MSG("not-there.txt: No such file");
    mkdir(path_of("sub"), 0755);
    write_text("dir.list", "sub\n");
    c.file_list = path_of("dir.list");
    CHECK(fl_criteo_open(&c) == NULL);
    CHECK_MSG("dir.list:1: ");
    CHECK_MSG("is a directory");
    write_text("empty.list", "# nothing\n\n");
    c.file_list = path_of("empty.list");
    CHECK(fl_criteo_open(&c) == NULL);
    CHECK_MSG("names no data files");
    c.file_list = path_of("no.list");
    CHECK(fl_criteo_open(&c) == NULL);
    CHECK_MSG("no.list: cannot open the file list");
    c.file_list = path_of("missing.list");
    c.rank = 2;
    c.world = 2;
    CHECK(fl_criteo_open(&c) == NULL);
    CHECK_MSG("rank 2, world 2");
    c.rank = 0;
    c.world = 1;
    c.format.ndense = 5;
    CHECK(fl_criteo_open(&c) == NULL);
    CHECK_MSG("minmax");
}

/* Three files of 5, 0 and 8 lines whose I1 is the line's number over all files. */
static void write_numbered(void) {
    int sizes[3] = {5, 0, 8}, n = 0;
    for (int f = 0; f < 3; f++) {
        char name[32], text[4096];
        int o = 0;
        snprintf(name, sizeof name, "n%d.txt", f);
        for (int i = 0; i < sizes[f]; i++, n++) {
            o += snprintf(text + o, sizeof text - (size_t)o, "%d\t%d", n % 2, n);
            for (int k = 0; k < 12 + 26; k++)
                o += snprintf(text + o, sizeof text - (size_t)o, "\t%s", k < 12 ? "" : "1");
            o += snprintf(text + o, sizeof text - (size_t)o, "\n");
        }
        text[o] = '\0';
        write_text(name, text);
    }
    write_text("n.list", "n0.txt\nn1.txt\nn2.txt\n");
}

static void test_sharding(void) {
    enum { LINES = 13 };
    write_numbered();
    for (int mode = 0; mode < 2; mode++)
        for (int world = 1; world <= 3; world++)
            for (int64_t B = 1; B <= 3; B++) {
                int seen[LINES] = {0}, nbatches[3] = {0}, bad = 0;
                for (int rank = 0; rank < world; rank++) {
                    fl_criteo_config c = fl_criteo_config_default();
                    c.file_list = path_of("n.list");
                    c.format.transform = FL_CTR_DENSE_RAW;
                    c.batch_size = B;
                    c.rank = rank;
                    c.world = world;
                    c.shard = mode ? FL_CTR_SHARD_LINES : FL_CTR_SHARD_FILES;
                    c.prefetch = (rank + B) % 2;
                    fl_criteo_reader *r = fl_criteo_open(&c);
                    CHECK(r != NULL);
                    if (!r)
                        continue;
                    const fl_ctr_batch *b;
                    int rc;
                    while ((rc = fl_criteo_next(r, &b)) == 1) {
                        int64_t g = nbatches[rank]++;
                        for (int64_t i = 0; i < b->batch; i++) {
                            int line = (int)b->dense[i * 13];
                            if (line < 0 || line >= LINES) {
                                bad++;
                                continue;
                            }
                            seen[line]++;
                            if (mode == 1) /* step g of rank r: [(g*world + r) * B, + B) */
                                bad += line / B != g * world + rank;
                            else /* Paddle's blocks of 3 files: world 2 -> {n0, n1}, {n2} */
                                bad += world == 2 && (line < 5) != (rank == 0);
                            bad += b->labels[i] != line % 2;
                        }
                    }
                    CHECK(rc == 0);
                    fl_criteo_close(r);
                }
                for (int i = 0; i < LINES; i++)
                    bad += seen[i] != 1;
                if (mode == 1) /* every rank the same number of steps: ceil(13 / (world B)) */
                    for (int rank = 0; rank < world; rank++)
                        bad += nbatches[rank] != (LINES + world * B - 1) / (world * B);
                if (bad)
                    fprintf(stderr, "sharding by %s, world %d, batch %lld: %d problems\n",
                            mode ? "lines" : "files", world, (long long)B, bad);
                CHECK(bad == 0);
            }
}

/* Random edits of a good line: the parser accepts or refuses with FL_EFORMAT, never anything
 * else, and what it accepts keeps the layout (offsets non-decreasing, ids in their slot). */
static void test_mutations(void) {
    static const char alphabet[] = "\t,0a9fz-\r \n";
    fl_criteo_format f = fl_criteo_format_default();
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, 13, 26, 1, 1));
    char g[512], line[512];
    good_line(g, sizeof g);
    size_t n = strlen(g);
    uint64_t x = 88172645463325252ull;
    int other = 0, accepted = 0;
    for (int t = 0; t < 20000; t++) {
        memcpy(line, g, n);
        for (int e = 0; e < 1 + t % 3; e++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            line[x % n] = alphabet[(x >> 32) % (sizeof alphabet)]; /* the NUL included */
        }
        int rc = fl_criteo_parse_line(&f, line, n, &b);
        other += rc != FL_OK && rc != FL_EFORMAT;
        accepted += rc == FL_OK;
    }
    int bad = 0;
    for (int64_t k = 0; k < b.batch * 26; k++) {
        bad += b.offsets[k + 1] < b.offsets[k];
        for (int64_t j = b.offsets[k]; j < b.offsets[k + 1]; j++)
            bad += fl_ctr_id_slot(b.ids[j]) != (int)(k % 26);
    }
    CHECK(other == 0 && bad == 0 && accepted == b.batch && accepted > 100);
    fprintf(stderr, "mutations: %d of 20000 accepted\n", accepted);
    fl_ctr_batch_free(&b);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fleet_test_criteo_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_generated();
    test_broken();
    test_fields();
    test_list_errors();
    test_sharding();
    test_mutations();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
