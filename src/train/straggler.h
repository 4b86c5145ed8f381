/* straggler.h - a benchmark's straggler, read from the environment by fleet-train: at each
 * training step, with a given probability, one rank sleeps, to emulate the slow trainers of
 * seed 002 (a worker that is late at random: Local SGD averages such delays out over its k
 * local steps, dense training waits for each of them). Off unless FLEET_BENCH_SLOW is set;
 * bench/localsgd_netlab.sh sets it. Private to src/train/. */
#ifndef FLEET_TRAIN_STRAGGLER_H
#define FLEET_TRAIN_STRAGGLER_H

#include "fleet/rng.h"

#include <stdbool.h>

typedef struct {
    bool   on;
    double prob;  /* per step */
    double ms;    /* sleep */
    int    fixed; /* the rank that is slow, or -1: drawn at random for every slow step */
    int    rank, world;
    fl_rng rng;   /* the same seed on every rank: all agree which rank is slow when */
} fl_straggler;

/* FLEET_BENCH_SLOW="PROB:MS[:RANK]": at each step, with probability PROB in [0, 1], rank RANK
 * (default: one drawn uniformly at random, a different one each time) sleeps MS milliseconds
 * (0 .. 60000) before its forward pass. Unset or empty: off. FL_ECONFIG naming the variable
 * for anything else. */
int fl_straggler_from_env(fl_straggler *s, int rank, int world);
/* Once per training step (loader batch) on every rank: sleeps if this rank is slow now. */
void fl_straggler_step(fl_straggler *s);

#endif /* FLEET_TRAIN_STRAGGLER_H */
