/* test_cuda_device.c - the cuda table without a GPU as with one: every entry but im2col and
 * col2im is there, "cuda" by name is the table, and device_bind answers with an error naming the
 * device (no device or driver: "no CUDA device: cudaGetDeviceCount says ..."; an ordinal beyond
 * the devices: how many there are) instead of crashing; ops that need a bound device refuse
 * with a message. Skipped only in builds without CUDA. Runs on the CPU-only CI. */
#include "fleet/backend.h"
#include "fleet/status.h"
#include "test.h"

#include <stdint.h>

/* every entry that must not be NULL, by name */
static void check_entries(const fl_backend *b) {
    struct {
        const char *name;
        const void *fn;
    } e[] = {
#define E(f) {#f, (const void *)(uintptr_t)b->f}
        E(preferred_layout), E(alloc), E(free), E(copy), E(fill), E(reorder),
        E(stream_create), E(stream_free), E(stream_sync), E(event_create), E(event_free),
        E(event_record), E(event_wait), E(event_sync), E(gemm), E(add_bias), E(sum_rows),
        E(act_forward), E(act_backward), E(axpy), E(scale), E(sum), E(sumsq),
        E(softmax_xent_forward), E(softmax_xent_backward), E(sgd_update), E(momentum_update),
        E(conv_plan_create), E(conv_plan_free), E(conv_scratch_bytes), E(conv_forward),
        E(conv_backward_data), E(conv_backward_filter), E(pool_forward), E(pool_backward),
        E(bn_forward), E(bn_backward), E(add_forward), E(add_backward), E(dropout_mask),
        E(channel_pad), E(xent_smooth_term), E(xent_smooth_backward), E(dgc_accumulate),
        E(dgc_select_exact), E(dgc_accumulate_select), E(dgc_accumulate_select_batch), E(dgc_encode), E(dgc_scatter_add),
        E(dgc_apply_pairs), E(dgc_apply_dense), E(device_bind), E(memory_peak),
        E(set_deterministic), E(bound_device),
#undef E
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (!e[i].fn) {
            fprintf(stderr, "cuda table: %s is NULL\n", e[i].name);
            test_failures++;
        }
    CHECK(!strcmp(b->name, "cuda"));
    CHECK(!b->host_memory);
    CHECK(b->preferred_layout(FL_DTYPE_F32) == FL_LAYOUT_NCHW);
}

int main(void) {
    const fl_backend *b = fl_backend_cuda();
    if (!b) {
        CHECK(fl_backend_by_name("cuda") == NULL);
        CHECK_MSG("built without CUDA");
        TEST_SKIP("fleet was built without CUDA (fl_backend_cuda() is NULL)");
    }
    check_entries(b);
    CHECK(fl_backend_by_name("cuda") == b);

    /* before any device is bound: no memory, no plans, nothing held */
    CHECK(b->memory_peak() == 0);
    fl_clear_error();
    CHECK(b->alloc(64) == NULL);
    CHECK_MSG("device_bind");
    fl_conv_desc d = {.dtype = FL_DTYPE_F32, .layout = FL_LAYOUT_NCHW, .max_batch = 1, .oc = 2,
                      .groups = 1, .g = {.c = 1, .h = 4, .w = 4, .kh = 3, .kw = 3, .sh = 1,
                                         .sw = 1, .dh = 1, .dw = 1}};
    CHECK(fl_conv_geom_out(&d.g));
    CHECK(b->conv_plan_create(&d) == NULL);
    CHECK_MSG("device_bind");

    /* an ordinal far beyond any machine's: an error naming it, with or without a GPU */
    int rc = b->device_bind(4096);
    CHECK(rc == FL_EINVAL || rc == FL_EIO);
    CHECK_MSG("CUDA device 4096");
    fprintf(stderr, "device_bind(4096): %s\n", fl_errmsg());
    rc = b->device_bind(-1);
    CHECK(rc == FL_EINVAL || rc == FL_EIO);
    CHECK_MSG("CUDA device -1");

    rc = b->device_bind(0);
    if (rc != FL_OK) { /* no GPU or no driver here: a clear error, not a crash */
        fprintf(stderr, "device_bind(0): %s\n", fl_errmsg());
        CHECK(rc == FL_EIO);
        CHECK_MSG("CUDA device 0");
        CHECK_MSG("no CUDA device: cudaGetDeviceCount says");
        CHECK(b->alloc(64) == NULL); /* still unbound */
        TEST_DONE();
    }
    /* a GPU: bound; binding it again is fine, another ordinal is refused */
    fprintf(stderr, "device_bind(0): ok\n");
    CHECK_OK(b->device_bind(0));
    rc = b->device_bind(4096);
    CHECK(rc == FL_EINVAL);
    CHECK_MSG("does not exist");
    void *p = b->alloc(64);
    CHECK(p != NULL);
    b->free(p);
    CHECK(b->memory_peak() > 0);
    TEST_DONE();
}
