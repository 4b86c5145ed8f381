/* status.h - status codes, the thread-local error message, and FL_ASSERT.
 *
 * Library functions return int: 0 (FL_OK) on success or a negative FL_E* code, and on failure
 * leave a message naming the culprit (key and line, file and line, peer, tensor) that
 * fl_errmsg() returns. The library never exits the process on bad input; FL_ASSERT is for
 * programming errors only and aborts with file:line in every build type. */
#ifndef FLEET_STATUS_H
#define FLEET_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FL_OK          = 0,
    FL_EINVAL      = -1,  /* bad argument or value */
    FL_ENOMEM      = -2,  /* allocation failed */
    FL_EIO         = -3,  /* file or socket I/O failed */
    FL_ECONFIG     = -4,  /* bad configuration: unknown key, wrong type, out of range */
    FL_EFORMAT     = -5,  /* malformed input file (list line, image, checkpoint) */
    FL_ESHAPE      = -6,  /* shape or dtype mismatch */
    FL_EUNSUPPORTED = -7, /* valid request that this build or backend cannot do */
    FL_ETIMEOUT    = -8,  /* a wait ran past its deadline */
    FL_EPEER       = -9,  /* a peer died, closed, or broke the protocol */
    FL_ESTATE      = -10, /* call made in the wrong state (e.g. before build) */
} fl_status;

/* Returns a static, human-readable name for a status code ("FL_ECONFIG"). */
const char *fl_status_name(int code);

/* The message of the last failure on the calling thread; "" if none. Valid until the next
 * fl_fail on this thread. */
const char *fl_errmsg(void);

/* Sets the calling thread's message (printf-style) and returns code, so that
 *     return fl_fail(FL_EIO, "%s:%d: label %s is not an integer", path, line, tok);
 * reports and returns in one statement. */
int fl_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to the current message, keeping the code: adds context on the way up. */
int fl_fail_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears the calling thread's message. */
void fl_clear_error(void);

/* Aborts with file:line and the expression. For programming errors, never for bad input. */
void fl_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define FL_ASSERT(x) ((x) ? (void)0 : fl_assert_fail(#x, __FILE__, __LINE__))

/* Propagates a failure: evaluates an int expression once and returns it if negative. */
#define FL_TRY(expr)                  \
    do {                              \
        int fl_try_rc_ = (expr);      \
        if (fl_try_rc_ < 0)           \
            return fl_try_rc_;        \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* FLEET_STATUS_H */
