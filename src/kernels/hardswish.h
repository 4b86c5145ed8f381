/* hardswish.h - hardswish(x) = x relu6(x + 3) / 6 and its derivative (backend.h), written as
 * PyTorch computes them: 0 at or below -3, x at or above 3 (so that -inf gives 0), x (x + 3) / 6
 * between; the derivative 0 below -3, 1 above 3, x / 3 + 1/2 on [-3, 3]. NaN passes through:
 * every comparison fails on it. Shared by the activation kernels and the batch norms that fuse
 * the hardswish after them (PP-LCNet's ConvBNLayer), so that both give the same bits. */
#ifndef FLEET_HARDSWISH_H
#define FLEET_HARDSWISH_H

#define FL_STAMP_HARDSWISH(T, S)                                                             \
    static inline T hardswish_##S(T x) {                                                     \
        return x <= (T)-3 ? (T)0 : x >= (T)3 ? x : x * (x + (T)3) / (T)6;                    \
    }                                                                                        \
    static inline T hardswish_grad_##S(T x) {                                                \
        return x < (T)-3 ? (T)0 : x > (T)3 ? (T)1 : x / (T)3 + (T)0.5;                       \
    }
FL_STAMP_HARDSWISH(float, f32)
FL_STAMP_HARDSWISH(double, f64)

#endif /* FLEET_HARDSWISH_H */
