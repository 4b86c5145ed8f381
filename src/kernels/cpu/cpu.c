/* cpu.c - the fl_kernels_cpu() table: OpenBLAS gemm (gemm.c) and OpenMP loops
 * (elementwise.c, act_kernels.c, reduce.c, softmax.c), gathered behind fl_kernel_ops. */
#include "cpu_impl.h"

static const fl_kernel_ops cpu_ops = {
    .name = "cpu",
    .gemm = cpu_gemm,
    .add_bias = cpu_add_bias,
    .sum_rows = cpu_sum_rows,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .sum = cpu_sum,
    .sumsq = cpu_sumsq,
    .softmax_xent_forward = cpu_softmax_xent_forward,
    .softmax_xent_backward = cpu_softmax_xent_backward,
    .sgd_update = cpu_sgd_update,
    .momentum_update = cpu_momentum_update,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
    .pool_forward = cpu_pool_forward,
    .pool_backward = cpu_pool_backward,
    .bn_stats = cpu_bn_stats,
    .bn_apply = cpu_bn_apply,
    .bn_backward = cpu_bn_backward,
};

const fl_kernel_ops *fl_kernels_cpu(void) { return &cpu_ops; }
