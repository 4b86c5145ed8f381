/* straggler.c - the benchmark straggler of straggler.h: one draw per step from a generator
 * seeded alike on every rank, so that exactly the chosen rank sleeps and no rank needs to talk
 * to the others about it. */
#include "train/straggler.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int fl_straggler_from_env(fl_straggler *s, int rank, int world) {
    memset(s, 0, sizeof *s);
    s->fixed = -1;
    s->rank = rank;
    s->world = world;
    const char *v = getenv("FLEET_BENCH_SLOW");
    if (!v || !*v)
        return FL_OK;
    char *end;
    s->prob = strtod(v, &end);
    if (end == v || *end != ':' || !(s->prob >= 0 && s->prob <= 1))
        goto bad;
    const char *m = end + 1;
    s->ms = strtod(m, &end);
    if (end == m || (*end != ':' && *end != '\0') || !(s->ms >= 0 && s->ms <= 60000))
        goto bad;
    if (*end == ':') {
        const char *r = end + 1;
        long fixed = strtol(r, &end, 10);
        if (end == r || *end != '\0' || fixed < 0 || fixed >= world)
            return fl_fail(FL_ECONFIG, "FLEET_BENCH_SLOW=%s: the rank must be in [0, %d)", v,
                           world);
        s->fixed = (int)fixed;
    }
    s->on = true;
    fl_rng_init(&s->rng, 0x5109, 0);
    FL_INFO("worker %d: FLEET_BENCH_SLOW: each step, with probability %g, %s sleeps %g ms",
            rank, s->prob, s->fixed >= 0 ? "one fixed rank" : "one rank drawn at random", s->ms);
    return FL_OK;
bad:
    return fl_fail(FL_ECONFIG, "FLEET_BENCH_SLOW=%s: expected PROB:MS[:RANK] with PROB in [0, 1] "
                               "and MS in [0, 60000]", v);
}

void fl_straggler_step(fl_straggler *s) {
    if (!s->on)
        return;
    /* both draws on every rank, whatever the outcome: the generators stay in step */
    bool slow = fl_rng_uniform_f64(&s->rng) < s->prob;
    int who = s->fixed >= 0 ? s->fixed : (int)fl_rng_below(&s->rng, (uint64_t)s->world);
    if (!slow || who != s->rank)
        return;
    double sec = s->ms / 1000.0;
    struct timespec ts = {.tv_sec = (time_t)sec,
                          .tv_nsec = (long)((sec - (double)(time_t)sec) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}
