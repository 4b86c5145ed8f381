/* test.h - the minimal harness every unit test uses: CHECK macros that report file:line and
 * keep going, closeness checks that print the first mismatch and the max difference (llm.c's
 * validate_result), and TEST_SKIP for what this machine lacks (exit 77 = ctest "skipped"). */
#ifndef FLEET_TEST_H
#define FLEET_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            test_failures++;                                                     \
        }                                                                        \
    } while (0)

/* CHECK that a library call returned status `want`; prints fl_errmsg() on a mismatch. */
#define CHECK_RC(expr, want)                                                              \
    do {                                                                                  \
        int rc_ = (expr);                                                                 \
        if (rc_ != (want)) {                                                              \
            fprintf(stderr, "%s:%d: %s returned %d, want %d (%s)\n", __FILE__, __LINE__, #expr, \
                    rc_, (int)(want), fl_errmsg());                                       \
            test_failures++;                                                              \
        }                                                                                 \
    } while (0)
#define CHECK_OK(expr) CHECK_RC(expr, 0)

/* CHECK that the current error message contains `needle`. */
#define CHECK_MSG(needle)                                                                  \
    do {                                                                                   \
        if (!strstr(fl_errmsg(), (needle))) {                                              \
            fprintf(stderr, "%s:%d: error message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, \
                    fl_errmsg(), (needle));                                                \
            test_failures++;                                                               \
        }                                                                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                              \
    do {                                                                                   \
        double a_ = (double)(a), b_ = (double)(b);                                         \
        if (!(fabs(a_ - b_) <= (tol))) {                                                   \
            fprintf(stderr, "%s:%d: %s = %.10g, %s = %.10g, |diff| %.3g > %.3g\n", __FILE__, \
                    __LINE__, #a, a_, #b, b_, fabs(a_ - b_), (double)(tol));               \
            test_failures++;                                                               \
        }                                                                                  \
    } while (0)

/* Compares n values: |got - want| <= atol + rtol*|want| elementwise. Prints the first mismatch
 * and the max abs difference; returns 1 if all match. */
static inline int check_close_impl(const char *what, const double *got, const double *want,
                                   long n, double atol, double rtol, const char *file, int line) {
    double maxdiff = 0;
    long first_bad = -1;
    for (long i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (d > maxdiff || isnan(d))
            maxdiff = isnan(d) ? INFINITY : d;
        if (first_bad < 0 && !(d <= atol + rtol * fabs(want[i])))
            first_bad = i;
    }
    if (first_bad >= 0) {
        fprintf(stderr, "%s:%d: %s: mismatch at [%ld]: got %.10g want %.10g; max |diff| %.3g\n",
                file, line, what, first_bad, got[first_bad], want[first_bad], maxdiff);
        test_failures++;
        return 0;
    }
    return 1;
}
#define CHECK_CLOSE(what, got, want, n, atol, rtol) \
    check_close_impl((what), (got), (want), (long)(n), (atol), (rtol), __FILE__, __LINE__)

/* Same for float arrays. */
static inline int check_close_f32_impl(const char *what, const float *got, const float *want,
                                       long n, double atol, double rtol, const char *file,
                                       int line) {
    double maxdiff = 0;
    long first_bad = -1;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > maxdiff || isnan(d))
            maxdiff = isnan(d) ? INFINITY : d;
        if (first_bad < 0 && !(d <= atol + rtol * fabs((double)want[i])))
            first_bad = i;
    }
    if (first_bad >= 0) {
        fprintf(stderr, "%s:%d: %s: mismatch at [%ld]: got %.8g want %.8g; max |diff| %.3g\n",
                file, line, what, first_bad, (double)got[first_bad], (double)want[first_bad],
                maxdiff);
        test_failures++;
        return 0;
    }
    return 1;
}
#define CHECK_CLOSE_F32(what, got, want, n, atol, rtol) \
    check_close_f32_impl((what), (got), (want), (long)(n), (atol), (rtol), __FILE__, __LINE__)

#define TEST_SKIP(why)                               \
    do {                                             \
        fprintf(stderr, "SKIPPED: %s\n", (why));     \
        exit(77);                                    \
    } while (0)

/* End of main(): prints a summary and returns the process status. */
#define TEST_DONE()                                                    \
    do {                                                               \
        if (test_failures) {                                           \
            fprintf(stderr, "FAILED: %d check(s)\n", test_failures);  \
            return 1;                                                  \
        }                                                              \
        fprintf(stderr, "ok\n");                                       \
        return 0;                                                      \
    } while (0)

#endif /* FLEET_TEST_H */
