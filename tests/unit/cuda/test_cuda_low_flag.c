/* test_cuda_low_flag.c - the cuda table's low_dtypes, opt-in until its low ops have passed on a
 * GPU: false unless FLEET_CUDA_LOW_DTYPES=1 when fl_backend_cuda() is first called, read once
 * per process (a later change of the variable changes nothing); and its preferred layouts
 * (f16 / bf16 channels-last, f32 NCHW unless FLEET_CUDA_NHWC=1, f64 NCHW). Each setting in a
 * child process of its own, so that each reads the environment afresh. Needs no GPU (neither
 * reads the device). Built only with CUDA. */
#include "fleet/backend.h"
#include "test.h"

#include <stdbool.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* In a child: FLEET_CUDA_LOW_DTYPES = low (NULL: unset), FLEET_CUDA_NHWC = nhwc (NULL: unset);
 * the table must say want_low and the layouts above, and keep saying it after the variable
 * flips. Returns whether the child's checks passed. */
static bool child(const char *low, const char *nhwc, bool want_low) {
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return false;
    }
    if (pid == 0) {
        test_failures = 0; /* the parent's count so far is not this child's */
        if (low)
            setenv("FLEET_CUDA_LOW_DTYPES", low, 1);
        else
            unsetenv("FLEET_CUDA_LOW_DTYPES");
        if (nhwc)
            setenv("FLEET_CUDA_NHWC", nhwc, 1);
        else
            unsetenv("FLEET_CUDA_NHWC");
        const fl_backend *k = fl_backend_cuda();
        CHECK(k != NULL);
        if (!k)
            _exit(1);
        CHECK(k->low_dtypes == want_low);
        CHECK(k->convert != NULL && k->gemm != NULL && k->conv_plan_create != NULL);
        CHECK(k->preferred_layout(FL_DTYPE_F16) == FL_LAYOUT_NHWC);
        CHECK(k->preferred_layout(FL_DTYPE_BF16) == FL_LAYOUT_NHWC);
        CHECK(k->preferred_layout(FL_DTYPE_F32) ==
              (nhwc && nhwc[0] == '1' ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW));
        CHECK(k->preferred_layout(FL_DTYPE_F64) == FL_LAYOUT_NCHW);
        /* read once: flipping the variable afterwards changes nothing */
        setenv("FLEET_CUDA_LOW_DTYPES", want_low ? "0" : "1", 1);
        CHECK(fl_backend_cuda() == k);
        CHECK(k->low_dtypes == want_low);
        _exit(test_failures ? 1 : 0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) {
        perror("waitpid");
        return false;
    }
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!ok)
        fprintf(stderr, "FLEET_CUDA_LOW_DTYPES=%s FLEET_CUDA_NHWC=%s: checks failed\n",
                low ? low : "(unset)", nhwc ? nhwc : "(unset)");
    return ok;
}

int main(void) { /* no fl_backend_cuda() here: the children must each be the first caller */
    CHECK(child(NULL, NULL, false)); /* the default: off */
    CHECK(child("0", NULL, false));
    CHECK(child("", NULL, false));
    CHECK(child("1", NULL, true));
    CHECK(child("1", "1", true));
    CHECK(child(NULL, "1", false));
    TEST_DONE();
}
