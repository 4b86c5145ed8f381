/* fastdiv.h - n / d for a divisor fixed over a kernel launch, by a multiply-high and a shift
 * instead of the GPU's division routine (tens of instructions in 32 bits, a long call in 64):
 * the round-up method of Granlund & Montgomery, "Division by Invariant Integers using
 * Multiplication" (PLDI 1994), as PyTorch's IntDivider uses it. The magic is made once on the
 * host; kernels whose every index fits in 31 bits use it (the quotient is exact for
 * 0 <= n < 2^31 and 1 <= d < 2^31), the others keep 64-bit division. Plain C as well as CUDA,
 * so tests/unit/test_fastdiv.c checks it on the host. */
#ifndef FLEET_KERNELS_CUDA_FASTDIV_H
#define FLEET_KERNELS_CUDA_FASTDIV_H

#include <stdint.h>

#ifdef __CUDACC__
#define FL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FL_HOST_DEVICE static inline
#endif

typedef struct fl_fastdiv {
    uint32_t d;     /* the divisor, 1 .. 2^31 - 1 */
    uint32_t magic; /* floor(2^32 (2^shift - d) / d) + 1 */
    uint32_t shift; /* ceil(log2 d) */
} fl_fastdiv;

/* The divider for d (1 <= d < 2^31). */
FL_HOST_DEVICE fl_fastdiv fl_fastdiv_make(uint32_t d) {
    fl_fastdiv f;
    uint32_t s = 0;
    while (s < 31 && ((uint32_t)1 << s) < d)
        s++;
    f.d = d;
    f.shift = s;
    f.magic = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1);
    return f;
}

/* n / f.d for 0 <= n < 2^31: t = the high half of n magic (t <= n, so t + n < 2^32). */
FL_HOST_DEVICE uint32_t fl_fastdiv_q(fl_fastdiv f, uint32_t n) {
    uint32_t t = (uint32_t)(((uint64_t)n * f.magic) >> 32);
    return (t + n) >> f.shift;
}

/* n % f.d, likewise */
FL_HOST_DEVICE uint32_t fl_fastdiv_r(fl_fastdiv f, uint32_t n) {
    return n - fl_fastdiv_q(f, n) * f.d;
}

#endif /* FLEET_KERNELS_CUDA_FASTDIV_H */
