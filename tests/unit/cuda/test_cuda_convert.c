/* test_cuda_convert.c - the cuda backend's private f32 <-> f16 / bf16 conversion
 * (src/kernels/cuda/convert.h, for mixed precision): exact values round-trip, halfway cases
 * round to even, overflow gives inf, NaN stays NaN, and other dtype pairs are refused. Built
 * only with CUDA (tests/CMakeLists.txt); skipped (77) without a GPU. */
#include "fleet/backend.h"
#include "fleet/status.h"
#include "kernels/cuda/convert.h"
#include "test.h"

#include <stdint.h>

/* bf16 by hand: the top 16 bits of the f32, rounded to nearest even */
static float bf16_ref(float x) {
    if (isnan(x))
        return x;
    uint32_t b;
    memcpy(&b, &x, 4);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &b, 4);
    return x;
}

/* f32 -> 16-bit -> f32 of n values on the device */
static void round_trip(const fl_backend *G, fl_dtype half, const float *x, float *y, int n) {
    void *dx = G->alloc((size_t)n * 4), *dh = G->alloc((size_t)n * 2), *dy = G->alloc((size_t)n * 4);
    FL_ASSERT(dx && dh && dy);
    G->copy(dx, x, (size_t)n * 4, FL_COPY_H2D, NULL);
    CHECK_OK(fl_cuda_convert(half, dh, FL_DTYPE_F32, dx, n, NULL));
    CHECK_OK(fl_cuda_convert(FL_DTYPE_F32, dy, half, dh, n, NULL));
    G->copy(y, dy, (size_t)n * 4, FL_COPY_D2H, NULL);
    G->stream_sync(NULL);
    G->free(dx), G->free(dh), G->free(dy);
}

int main(void) {
    const fl_backend *G = fl_backend_cuda();
    if (!G)
        TEST_SKIP("no CUDA device (fleet was built without CUDA)");
    if (G->device_bind(0) != FL_OK) {
        char why[600];
        snprintf(why, sizeof why, "no CUDA device (%s)", fl_errmsg());
        TEST_SKIP(why);
    }
    /* f16: 11 significant bits, max 65504; 1 + 2^-11 is halfway between 1 and 1 + 2^-10 */
    float x[] = {0.0f, -0.0f, 1.0f, -2.25f, 65504.0f, 1e6f, -1e6f, 1.0f + 0x1p-11f,
                 1.0f + 3 * 0x1p-11f, 0x1p-24f, NAN};
    float want16[] = {0.0f, -0.0f, 1.0f, -2.25f, 65504.0f, INFINITY, -INFINITY, 1.0f,
                      1.0f + 0x1p-9f, 0x1p-24f, NAN};
    int n = (int)(sizeof x / sizeof x[0]);
    float y[16];
    round_trip(G, FL_DTYPE_F16, x, y, n);
    for (int i = 0; i < n; i++)
        if (!(y[i] == want16[i] || (isnan(y[i]) && isnan(want16[i])))) {
            fprintf(stderr, "f16 round trip of %.9g: %.9g, want %.9g\n", x[i], y[i], want16[i]);
            test_failures++;
        }
    CHECK(signbit(y[1]));
    /* bf16: 8 significant bits, f32's range; 1 + 2^-8 is halfway between 1 and 1 + 2^-7;
     * 3.4e38 rounds up past the largest bf16 */
    float xb[] = {0.0f, 1.0f, -3.0f, 1e30f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.4e38f, NAN};
    n = (int)(sizeof xb / sizeof xb[0]);
    float wantb[8];
    for (int i = 0; i < n; i++)
        wantb[i] = bf16_ref(xb[i]);
    CHECK(wantb[4] == 1.0f && wantb[5] == 1.0f + 0x1p-6f && isinf(wantb[6]));
    round_trip(G, FL_DTYPE_BF16, xb, y, n);
    for (int i = 0; i < n; i++)
        if (!(y[i] == wantb[i] || (isnan(y[i]) && isnan(wantb[i])))) {
            fprintf(stderr, "bf16 round trip of %.9g: %.9g, want %.9g\n", xb[i], y[i], wantb[i]);
            test_failures++;
        }
    /* other pairs are refused, naming them */
    CHECK_RC(fl_cuda_convert(FL_DTYPE_F16, NULL, FL_DTYPE_BF16, NULL, 4, NULL), FL_EINVAL);
    CHECK_MSG("bf16");
    CHECK_OK(fl_cuda_convert(FL_DTYPE_F16, NULL, FL_DTYPE_F32, NULL, 0, NULL)); /* n = 0 */
    TEST_DONE();
}
