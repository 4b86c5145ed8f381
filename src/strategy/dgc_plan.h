/* dgc_plan.h - the Deep Gradient Compression strategy's plan and state (dgc_plan.c): which
 * tensors are compressed, every buffer, u and v as checkpointable state, and the step in
 * flight. Private to the strategy, whose exchange (the hooks, the sparse step, update) is
 * dgc.c's; the arithmetic is dgc_math.c's. */
#ifndef FLEET_STRATEGY_DGC_PLAN_H
#define FLEET_STRATEGY_DGC_PLAN_H

#include "dgc_math.h"
#include "strategy_impl.h"

typedef struct {
    fl_param *p;    /* borrowed: the network's parameter */
    fl_param *vel;  /* borrowed: its optimizer velocity */
    fl_param  u, v; /* "dgc.u.<name>" (momentum), "dgc.v.<name>" (accumulator): views */
} ctensor;

typedef struct {
    dense_state *dense;  /* the dense phase before rampup_begin_step */
    void        *tables; /* one zeroed block that every per-parameter table below (ct, start,
                          * gseg, wseg, vseg, dp, dvel, vel_of, ct_of, kk, cnt, soff, prepared,
                          * req, xreq, xcounts, hint, hint_k, group_of, group_lo, ready, items,
                          * gcount) is carved from (dgc_plan.c) */
    ctensor     *ct;     /* (nct) compressed tensors, in parameter order */
    int          nct;
    int64_t     *start;  /* (nct + 1) their ranges in the compressed index space */
    float      **gseg;   /* (nct) their gradients: the scatter-add target */
    float      **wseg;   /* (nct) their values */
    float      **vseg;   /* (nct) their accumulators: where the sparse exchange's dropped pairs
                          * return */
    int64_t      cnumel; /* compressed elements */
    float       *ublock, *vblock; /* (cnumel) the state's memory, u and v of every tensor */
    float       *hv;     /* (cnumel) host copy of vblock for the dense fallback's allreduce */
    fl_param   **dp;     /* (ndp) trainable tensors that stay dense */
    fl_param   **dvel;   /* (ndp) their optimizer velocities (borrowed from the optimizer) */
    int          ndp;
    int64_t      dnumel;
    float       *dstage;  /* (dnumel) their gradients packed for one allreduce */
    float       *hdstage; /* (dnumel) its host copy, for comm */
    fl_param   **vel_of;  /* (nparams) optimizer velocity of each parameter, or NULL */
    float       *scratch; /* selection: largest tensor + its sample */
    int32_t     *idx;     /* selection: largest tensor */
    int         *ct_of;   /* (nparams) compressed tensor of each parameter, or -1 */
    dgc_pair    *send;    /* (send_cap) this rank's pairs: tensor c's kk[c] at soff[c] */
    dgc_pair    *recv;    /* (max(world, budget) * send_cap) allgather: every rank's,
                           * tensor c's at world * soff[c]; sparse: the kept sums */
    dgc_pair    *hsend, *hrecv; /* host copies of send and recv, for comm (and the padding) */
    int32_t     *kidx;    /* (send_cap) the sparse exchange's kept indices, whose u is masked */
    int64_t      send_cap;
    double       said;     /* sparsity whose dense fallback was last logged; -1: none */
    int          said_exchange; /* the exchange last logged; -1: none */
    int64_t      pairs, dropped; /* pairs given to the exchange, dropped by its threshold */
    /* the sparse exchange (host memory): this rank's pairs in index order, the kept sums, the
     * kept flags */
    int32_t     *xidx;    /* host memory, as xval, xkept, oidx and oval */
    float       *xval;
    uint8_t     *xkept;
    int32_t     *oidx; /* (budget * send_cap) the kept sums */
    float       *oval;
    /* the sparse step in flight, begun by the first hook or by update */
    int64_t      step;     /* the update these describe; -1: none */
    bool         early;    /* tensors are prepared by the hook (not with local clipping) */
    bool         avg_early; /* hierarchical: the hook starts each tensor's node average */
    bool         xsparse;  /* this step's pairs go through the sparse allreduce */
    int64_t     *kk;       /* (nct) pairs every rank sends for each tensor in this step */
    int64_t     *cnt;      /* (nct) of which this rank's real ones (the rest: zero padding) */
    int64_t     *soff;     /* (nct + 1) where they start in send */
    bool        *prepared; /* (nct) accumulated, selected and encoded */
    fl_request **req;      /* (nct) each tensor's allgather in flight, or NULL */
    fl_request **xreq;     /* (nct) hierarchical: each tensor's node average, then its
                            * allgather between nodes */
    size_t      *xcounts;  /* (node size) hierarchical: the node allgatherv's counts */
    int          launched; /* tensors launched, in launch order: the last (c = nct - 1) first */
    float       *hint;     /* (nct) each tensor's k-th largest |v| at its last selection, or 0 */
    int64_t     *hint_k;   /* (nct) the k it was for (a new k starts without one) */
    /* selection groups: on a device backend the tensors are cut, in backward's order, into
     * groups of about DGC_GROUP_VALUES values, and a group is accumulated, selected and
     * encoded in one batched call (fl_backend_dgc_batch: one wait, one copy back) once every
     * gradient in it is final, where selecting tensor by tensor waited on the device 52 times a
     * ResNet-50 step; exchanges still start group by group during backward. On the host each
     * tensor is its own group (nothing to wait for). */
    int         *group_of; /* (nct) the group of each tensor */
    int         *group_lo; /* (nct + 1) group j holds tensors [group_lo[j], group_lo[j + 1]) */
    int          ngroups;
    bool        *ready;    /* (nct) its gradient is final in this step (the hook saw it) */
    fl_dgc_batch_item *items; /* (nct) a group's batched call */
    int64_t     *gcount;   /* (nct) its counts */
    int          error;    /* first failure of the hook in this step */
    char         errmsg[512];
} dgc;

/* The values a selection group gathers on a device backend before its batched call. */
#define DGC_GROUP_VALUES ((int64_t)4 << 20)

/* dgc_configs.sparse_budget: the sparse allreduce keeps at most budget * k summed pairs. */
static inline int dgc_budget(const fl_dist_optim *d) {
    return (int)d->s.dgc_configs.sparse_budget;
}

/* dgc_plan.c */

/* The strategy's setup (strategy_ops.setup): d->impl, a dgc planned for d's network. */
int  dgc_plan_setup(fl_dist_optim *d);
/* Frees g and everything it holds (be: the network's backend); nothing may be in flight. */
void dgc_plan_free(const fl_backend *be, dgc *g);
/* u and v of every compressed tensor, the strategy's checkpointable state. */
int  dgc_plan_num_state(const fl_dist_optim *d);
fl_param *dgc_plan_state(fl_dist_optim *d, int i);
fl_state_merge dgc_plan_merge(const fl_dist_optim *d, int i);

#endif /* FLEET_STRATEGY_DGC_PLAN_H */
