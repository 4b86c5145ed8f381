/* fleet.h - the umbrella header and the collective-mode Fleet API.
 *
 * A single-worker program becomes a distributed one in the seed documents' four steps
 * ("四步改造法"): initialise from the environment, wrap the optimizer, train, save on rank 0.
 *
 *     fl_fleet *fleet;                                   // 1. init (fleetrun/mpirun env)
 *     fl_fleet_init(NULL, &fleet);
 *     fl_strategy strategy;                              // 2. wrap the optimizer
 *     fl_strategy_defaults(&strategy);
 *     fl_dist_optim *dopt = fl_distributed_optimizer(fleet, net, opt, &strategy);
 *     for (step = 0; step < steps; step++) {             // 3. train: forward and loss as
 *         fl_net_forward(net, x, true, &logits);         //    before; fl_dist_minimize
 *         fl_softmax_xent_forward(k, logits, y, probs, &loss);   //  replaces backward +
 *         fl_softmax_xent_backward(k, probs, y, probs);  //    optimizer step
 *         fl_dist_minimize(dopt, probs, lr, NULL);
 *     }
 *     if (fl_worker_index(fleet) == 0) { ... save ... }  // 4. save on rank 0
 *     fl_dist_optim_free(dopt);
 *     fl_fleet_free(fleet);
 *
 * The loader shards the data: give it rank = fl_worker_index and world = fl_worker_num. */
#ifndef FLEET_FLEET_H
#define FLEET_FLEET_H

#include "fleet/auth.h"
#include "fleet/comm.h"
#include "fleet/config.h"
#include "fleet/ctr.h"
#include "fleet/data.h"
#include "fleet/image.h"
#include "fleet/backend.h"
#include "fleet/log.h"
#include "fleet/metrics.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/ps.h"
#include "fleet/rng.h"
#include "fleet/sparse.h"
#include "fleet/status.h"
#include "fleet/strategy.h"
#include "fleet/tensor.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_fleet fl_fleet;

/* Collective mode from the environment fleetrun, mpirun or torchrun set (a plain process is a
 * job of one). backend: NULL or "" (automatic), "tcp", "mpi". Fails with the communicator's
 * message (which variable is wrong, which peer is missing). */
int  fl_fleet_init(const char *backend, fl_fleet **out);
void fl_fleet_free(fl_fleet *f);

/* Paddle's fleet.worker_index(), worker_num(), worker_endpoints(): fl_worker_endpoint gives
 * "ip:port" of worker i ("" on backends without endpoints, such as mpi), NULL if i is not in
 * [0, worker_num). */
int         fl_worker_index(const fl_fleet *f);
int         fl_worker_num(const fl_fleet *f);
const char *fl_worker_endpoint(const fl_fleet *f, int i);
/* The communicator underneath (borrowed), e.g. to average metrics. */
fl_comm    *fl_fleet_comm(fl_fleet *f);
int         fl_barrier(fl_fleet *f);

/* Parameter-server mode (include/fleet/ps.h): a worker that joined servers with
 * fl_ps_init_worker attaches its fl_ps (borrowed; it must outlive the fleet's distributed
 * optimizers), and fl_distributed_optimizer then keeps the parameters on the servers as
 * strategy.a_sync says. NULL detaches. */
void   fl_fleet_set_ps(fl_fleet *f, fl_ps *ps);
fl_ps *fl_fleet_ps(const fl_fleet *f);

typedef struct fl_dist_optim fl_dist_optim;

/* Paddle's fleet.distributed_optimizer(optimizer, strategy): wraps opt, which updates net's
 * parameters (f, net and opt are borrowed and must outlive the result), under strategy s
 * (copied). Checks the strategy (fl_strategy_check, without was_set: callers reading a config
 * check with it first), broadcasts rank 0's parameter block (trainable values and buffers) so
 * that every replica starts identical, and plans the gradient buckets and every buffer the
 * steps need: walking the parameters last to first, a bucket takes gradients until the next
 * would pass fuse_grad_size_in_MB (a larger one is a bucket alone; 0: one per parameter), so
 * each bucket is one contiguous range of the flat gradient block and one allreduce.
 * A collective call on every worker. NULL with fl_errmsg on failure. */
fl_dist_optim *fl_distributed_optimizer(fl_fleet *f, fl_net *net, fl_optim *opt,
                                        const fl_strategy *s);
void fl_dist_optim_free(fl_dist_optim *d);

/* The step that replaces minimize: back-propagates dout (the loss gradient w.r.t. the net's
 * output of the last forward) through net, averages the gradients over all workers as the
 * strategy says, then applies the optimizer with learning rate lr. With overlap on, a bucket's
 * allreduce starts from the gradient-ready hook as soon as its last gradient is final and
 * backward goes on; with it off, all buckets start after backward; both give bit-identical
 * results. fp16_allreduce divides each bucket by N (and by k under gradient_merge with avg) in
 * f32, sends it as an f16 sum, and converts back. With gradient_merge, calls 1 .. k_steps-1 of
 * a cycle only accumulate (the first overwrites the previous gradients); the k_steps-th also
 * communicates, divides the merged gradient by k_steps if avg, and updates. *updated (may be
 * NULL) says whether this call updated. A job of one communicates nothing. Allocates nothing
 * itself (the communicator's requests aside). Under strategy.amp (docs/amp.md; set up by
 * fl_distributed_optimizer, which makes net compute its white-listed layers in f16/bf16 from
 * then on) backward starts from dout times the loss scale, each worker checks its gradients
 * for inf/NaN, one allreduce (max) combines the flag, and a step with an inf anywhere is
 * skipped on every worker: *updated is true (the step is consumed: the counters move on), no
 * parameter or state changes, fl_dist_stats.skipped counts it; else the strategy runs on
 * unscaled gradients. The scale then follows Paddle's update_loss_scaling. A collective call on every worker, from the
 * thread that issues the communicator's collectives. */
int fl_dist_minimize(fl_dist_optim *d, const fl_tensor *dout, double lr, bool *updated);

/* After the last fl_dist_minimize of a run: brings every worker's replica to the job's final
 * state where the strategy leaves replicas apart (parameter-server async and geo modes: what
 * is queued is sent, then every worker takes the servers' values). A collective call on every
 * worker; a no-op for the others. */
int fl_dist_finish(fl_dist_optim *d);
/* The local (this worker's) loss of the update the next fl_dist_minimize completes. Optional
 * for most strategies; adaptive Local SGD needs it before every update (it averages the loss
 * over the workers at synchronisation steps). Cleared by fl_dist_minimize. FL_EINVAL if the
 * loss is not finite. */
int fl_dist_set_loss(fl_dist_optim *d, double loss);

/* Updates completed (0-based index of the next update). */
int64_t fl_dist_step(const fl_dist_optim *d);

/* The distributed optimizer's state for checkpoints: named tensors, borrowed, live (writing
 * their values restores the state): index 0 is "dist.counters" (i64: updates done,
 * micro-batches done in the current gradient-merge cycle), under strategy.amp index 1 is
 * "amp.state" (f64: loss scale, good steps, bad steps, skipped steps; the same on every
 * rank), then the strategy's own, e.g.
 * "dgc.u.<param>", "localsgd.snapshot.<param>", "localsgd.counters". Their number and shapes
 * are fixed once fl_distributed_optimizer returns; the state of every rank may differ (DGC),
 * so save it per rank. fl_dist_state returns NULL for i outside [0, fl_dist_num_state). */
int       fl_dist_num_state(const fl_dist_optim *d);
fl_param *fl_dist_state(fl_dist_optim *d, int i);

/* How a state tensor of several workers becomes one worker's when a job resumes with another
 * number of workers (docs/elastic.md): FL_STATE_SAME, identical on every rank (counters; taken
 * from rank 0, the others checked against it); FL_STATE_MEAN, the mean over the old workers
 * (parameters, optimizer state, Local SGD's snapshot: what the next synchronisation would have
 * made of them); FL_STATE_SUM, worker r of the new job takes the sum of the old workers j with
 * j mod new_world == r (DGC's residuals: their sum over the workers is the update still owed,
 * which this keeps whole). */
typedef enum { FL_STATE_SAME = 0, FL_STATE_MEAN = 1, FL_STATE_SUM = 2 } fl_state_merge;
/* The rule for fl_dist_state(d, i): the strategy's, else SAME for integer tensors and MEAN for
 * floating-point ones. */
fl_state_merge fl_dist_state_merge(const fl_dist_optim *d, int i);

/* Bytes this worker has sent on the communicator since fl_distributed_optimizer returned (so
 * not the initial broadcast; all collectives, also those the caller issues itself). */
uint64_t fl_dist_bytes_sent(const fl_dist_optim *d);

/* What the strategy has been doing, for progress lines, metrics and plots. */
typedef struct {
    int64_t updates;  /* updates completed (fl_dist_step) */
    int64_t synced;   /* of the updates this object completed, those that sent anything: every
                       * one for dense and DGC, the averaging steps for Local SGD (not restored
                       * by a checkpoint: after a resume it counts from there) */
    int64_t interval; /* Local SGD: the interval k now in force (adaptive: the last one chosen);
                       * 0 for the other strategies */
    double  sparsity; /* DGC: the sparsity the last update sent at (0 while dense: before the
                       * warm-up or in the dense fallback); NaN for the other strategies */
    int64_t pairs;    /* DGC: (index, value) pairs this worker gave to the exchange, and of */
    int64_t dropped;  /* them those a sparse allreduce's global threshold dropped (returned to
                       * its accumulator), over the updates this object completed; 0 else */
    double  loss_scale; /* strategy.amp: the loss scale the next update uses; NaN without amp */
    int64_t skipped;  /* strategy.amp: updates skipped for inf/NaN gradients since the run began
                       * (restored by a checkpoint); 0 without amp */
} fl_dist_stats;
void fl_dist_get_stats(const fl_dist_optim *d, fl_dist_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_FLEET_H */
