/* test_metrics.c - JSON lines metrics: exact text for ints, doubles (0.1, 1e-300, NaN, inf,
 * -0.0), escaped strings (quotes, backslashes, control characters, UTF-8); each record flushed
 * as it ends; FL_EIO naming the path for a missing directory and a full disk. */
#include "fleet/metrics.h"
#include "fleet/status.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

/* Reads a whole file into a malloc'd, NUL-terminated string (NULL if it cannot). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    (void)n;
    fclose(f);
    return buf;
}

static void check_text(const char *path, const char *want) {
    char *got = slurp(path);
    CHECK(got != NULL);
    if (got && strcmp(got, want) != 0) {
        fprintf(stderr, "file text differs:\n got: %s\nwant: %s\n", got, want);
        test_failures++;
    }
    free(got);
}

int main(void) {
    char dir[] = "/tmp/fleet_test_metrics_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);

    fl_metrics *m = fl_metrics_open(path);
    CHECK(m != NULL);
    if (!m)
        TEST_DONE();

    /* Numbers. */
    const char *line1 = "{\"phase\":\"train\",\"step\":10,\"min\":-9223372036854775808,"
                        "\"max\":9223372036854775807,\"loss\":0.69310000000000005,"
                        "\"a\":0.10000000000000001,\"tiny\":1e-300,\"big\":1.0000000000000001e+300,"
                        "\"denorm\":4.9406564584124654e-324,\"nan\":null,\"inf\":null,"
                        "\"ninf\":null,\"negzero\":-0,\"one\":1}\n";
    fl_metrics_begin(m);
    fl_metrics_str(m, "phase", "train");
    fl_metrics_int(m, "step", 10);
    fl_metrics_int(m, "min", INT64_MIN);
    fl_metrics_int(m, "max", INT64_MAX);
    fl_metrics_num(m, "loss", 0.6931);
    fl_metrics_num(m, "a", 0.1);
    fl_metrics_num(m, "tiny", 1e-300);
    fl_metrics_num(m, "big", 1e300);
    fl_metrics_num(m, "denorm", 5e-324);
    fl_metrics_num(m, "nan", NAN);
    fl_metrics_num(m, "inf", INFINITY);
    fl_metrics_num(m, "ninf", -INFINITY);
    fl_metrics_num(m, "negzero", -0.0);
    fl_metrics_num(m, "one", 1.0);
    CHECK_OK(fl_metrics_end(m));
    /* Flushed at end: readable before close. */
    check_text(path, line1);

    /* Strings: quotes, backslashes, newlines, every kind of control character, UTF-8 as is;
     * keys are escaped too. */
    const char *line2 = "{\"q\\\"k\":\"say \\\"hi\\\"\",\"bs\":\"C:\\\\dir\\\\\","
                        "\"nl\":\"a\\nb\\r\\n\",\"ctl\":\"\\t\\b\\f\\u0001\\u001f\x7f\","
                        "\"utf8\":\"h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x9a\x80\",\"empty\":\"\","
                        "\"null\":null}\n";
    fl_metrics_begin(m);
    fl_metrics_str(m, "q\"k", "say \"hi\"");
    fl_metrics_str(m, "bs", "C:\\dir\\");
    fl_metrics_str(m, "nl", "a\nb\r\n");
    fl_metrics_str(m, "ctl", "\t\b\f\x01\x1f\x7f");
    fl_metrics_str(m, "utf8", "h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x9a\x80");
    fl_metrics_str(m, "empty", "");
    fl_metrics_str(m, "null", NULL);
    CHECK_OK(fl_metrics_end(m));

    /* An empty record, and a long string that outgrows the buffer's first allocation. */
    fl_metrics_begin(m);
    CHECK_OK(fl_metrics_end(m));
    char *longs = malloc(5001);
    memset(longs, 'x', 5000);
    longs[5000] = '\0';
    fl_metrics_begin(m);
    fl_metrics_str(m, "s", longs);
    CHECK_OK(fl_metrics_end(m));

    size_t want_len = strlen(line1) + strlen(line2) + 3 + 5000 + 9;
    char *want = malloc(want_len + 1);
    snprintf(want, want_len + 1, "%s%s{}\n{\"s\":\"%s\"}\n", line1, line2, longs);
    check_text(path, want);
    fl_metrics_close(m);
    check_text(path, want); /* closing adds nothing */
    free(want);
    free(longs);

    /* Reopening truncates. */
    m = fl_metrics_open(path);
    CHECK(m != NULL);
    fl_metrics_close(m);
    check_text(path, "");
    fl_metrics_close(NULL);

    /* A path in a directory that does not exist. */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/m.jsonl", dir);
    fl_clear_error();
    CHECK(fl_metrics_open(bad) == NULL);
    CHECK_MSG(bad);
    CHECK_MSG("No such file or directory");

    /* A write that fails (a full disk): FL_EIO naming the path, from fl_metrics_end. */
    if (access("/dev/full", W_OK) == 0) {
        m = fl_metrics_open("/dev/full");
        CHECK(m != NULL);
        if (m) {
            fl_metrics_begin(m);
            fl_metrics_int(m, "step", 1);
            CHECK_RC(fl_metrics_end(m), FL_EIO);
            CHECK_MSG("/dev/full");
            fl_metrics_close(m);
        }
    }

    unlink(path);
    rmdir(dir);
    TEST_DONE();
}
