/* localsgd_rule.h - the schedule of Local SGD as pure functions, apart from the strategy that
 * communicates (localsgd.c), so that the tests can check which steps synchronise and what
 * interval adaptive communication picks without a network. Steps count from 1, as Paddle's
 * step counter (LocalSGDOptimizer, AdaptiveLocalSGDOptimizer) does. */
#ifndef FLEET_LOCALSGD_RULE_H
#define FLEET_LOCALSGD_RULE_H

#include <stdbool.h>
#include <stdint.h>

/* The largest interval adaptive communication picks (Paddle's max_local_steps). */
#define FL_LOCALSGD_MAX_K 16

/* Whether step (>= 1) synchronises: every step while step <= begin_step (synchronous warm-up,
 * post-local SGD: Lin et al. 2018, arXiv:1808.07217, sec. 3), afterwards when
 * step - last_sync >= k (last_sync: the last step that synchronised; more than k only when
 * the due step was skipped for inf/NaN gradients under strategy.amp: the next one averages). */
bool fl_localsgd_rule_due(int64_t step, int64_t begin_step, int64_t last_sync, int64_t k);

/* The reference learning rate lr0 of the interval rule after a step with rate lr, given the
 * previous lr0 (0 before step 1): the largest rate seen so far, max(lr0, lr). Wang & Joshi's
 * eta_0 is the rate training starts from before the schedule lowers it; under a warm-up the
 * rate of step 1 is a small fraction of that (or 0), and taking it would keep lr0 / lr <= 1,
 * k at its smallest and adaptive equal to dense. The running maximum is the warm-up's peak
 * once the warm-up is over, the initial rate of a piecewise or cosine decay without one, and
 * follows the rate while it rises, so lr0 / lr >= 1 always: the interval grows as the rate
 * decays below its peak, as in AdaComm. A rate that is not a number is ignored. */
double fl_localsgd_rule_lr0(double lr0, double lr);

/* The next interval of adaptive communication after a synchronisation:
 *     k = ceil(sqrt(lr0 * loss / (lr * loss0) * init_k)), clamped to [1, FL_LOCALSGD_MAX_K]
 * with lr0 the reference rate (fl_localsgd_rule_lr0), loss0 the rank-averaged loss of step 1
 * and lr, loss those of the synchronising step. This is Paddle's form; Wang & Joshi 2018 (AdaComm, arXiv:1810.08313)
 * keep tau_0 outside the root: ceil(sqrt(lr0 * loss / (lr * loss0)) * tau_0). A ratio
 * that is not a number (0/0) gives 1, an infinite one (lr = 0 or loss0 = 0) 16, as the clamp of
 * Paddle's float ops would. */
int64_t fl_localsgd_rule_next_k(double lr0, double loss0, double lr, double loss,
                                int64_t init_k);

/* The same in Wang & Joshi's form, tau_0 = init_k outside the root:
 *     k = ceil(sqrt(lr0 * loss / (lr * loss0)) * init_k), clamped to [1, FL_LOCALSGD_MAX_K]
 * At the start (both ratios 1) it is init_k, as in the paper; Paddle's form starts at
 * ceil(sqrt(init_k)) and reacts to the ratios with the square root of init_k as its scale. The
 * edge cases are those of fl_localsgd_rule_next_k. */
int64_t fl_localsgd_rule_next_k_adacomm(double lr0, double loss0, double lr, double loss,
                                        int64_t init_k);

#endif /* FLEET_LOCALSGD_RULE_H */
