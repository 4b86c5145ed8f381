/* cpu.c - the fl_backend_cpu() table: OpenBLAS gemm (gemm.c) and OpenMP loops
 * (elementwise.c, act_kernels.c, reduce.c, softmax.c, channel_ops.c), gathered behind
 * fl_backend. */
#include "backend_private.h"

static fl_conv_plan *cpu_conv_plan_create(const fl_conv_desc *d) {
    return cpu_conv_plan_create_with(fl_backend_cpu(), d, true);
}

static const fl_backend cpu_ops = {
    .name = "cpu",
    CPU_BACKEND_SHARED,
    .fill = cpu_fill,
    .reorder = cpu_reorder,
    .add_forward = cpu_add_forward,
    .add_backward = cpu_add_backward,
    .dropout_mask = cpu_dropout_mask,
    .channel_pad = cpu_channel_pad,
    .channel_slice = cpu_channel_slice,
    .gemm = cpu_gemm,
    .add_bias = cpu_add_bias,
    .sum_rows = cpu_sum_rows,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .amp_round = cpu_amp_round,
    .sum = cpu_sum,
    .sumsq = cpu_sumsq,
    .softmax_xent_forward = cpu_softmax_xent_forward,
    .softmax_xent_backward = cpu_softmax_xent_backward,
    .sgd_update = cpu_sgd_update,
    .momentum_update = cpu_momentum_update,
    .conv_plan_create = cpu_conv_plan_create,
    .conv_plan_free = cpu_conv_plan_free,
    .conv_scratch_bytes = cpu_conv_scratch_bytes,
    .conv_forward = cpu_conv_forward,
    .conv_backward_data = cpu_conv_backward_data,
    .conv_backward_filter = cpu_conv_backward_filter,
    .pool_forward = cpu_pool_forward,
    .pool_backward = cpu_pool_backward,
    .bn_forward = cpu_bn_forward,
    .bn_backward = cpu_bn_backward,
    .bn_running = cpu_bn_running,
    .channel_mul_forward = cpu_channel_mul_forward,
    .channel_mul_backward = cpu_channel_mul_backward,
};

const fl_backend *fl_backend_cpu(void) { return &cpu_ops; }
