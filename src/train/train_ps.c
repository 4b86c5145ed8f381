/* train_ps.c - fleet-train in parameter-server mode (docs/ps.md): the same config plays either
 * role, as Paddle's fleet.init(is_collective=False) programs do. A server serves the tables
 * until every worker is done; a worker joins the servers and hands the fleet its fl_ps, so
 * that the distributed optimizer keeps the parameters there (src/strategy/ps.c). The workers
 * still form a collective communicator among themselves, for progress lines and evaluation. */
#include "train/train_impl.h"

#include "fleet/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool fl_train_ps_mode(void) {
    const char *role = getenv("TRAINING_ROLE");
    return role && role[0];
}

static fl_ps_mode mode_of(const fl_strategy *s) {
    return !s->a_sync ? FL_PS_SYNC : s->a_sync_configs.k_steps > 0 ? FL_PS_GEO : FL_PS_ASYNC;
}

bool fl_train_ps_is_server(void) {
    const char *role = getenv("TRAINING_ROLE");
    return role && strcmp(role, "PSERVER") == 0;
}

int fl_train_serve(const fl_train_config *cfg, bool *started) {
    *started = false;
    fl_ps *ps = NULL;
    int rc = fl_ps_init(&ps);
    if (rc < 0)
        return fl_fail_prefix(rc, "parameter server");
    if (!fl_ps_is_server(ps)) {
        fl_ps_free(ps);
        return fl_fail(FL_ECONFIG, "TRAINING_ROLE: this process is not a server");
    }
    fl_ps_server_config sc = {.threads = (int)cfg->ps.server_threads,
                              .mode = mode_of(&cfg->strategy),
                              .resume = cfg->checkpoint.resume[0] != 0,
                              .resume_step = -1,
                              .keep = cfg->checkpoint.keep};
    snprintf(sc.checkpoint_dir, sizeof sc.checkpoint_dir, "%s", cfg->checkpoint.dir);
    if (sc.resume && !sc.checkpoint_dir[0])
        rc = fl_fail(FL_ECONFIG, "checkpoint.resume: a parameter server resumes from its shards "
                                 "in checkpoint.dir, which is not set");
    /* the step the workers resume from, found as they will find it: its shards are loaded
     * (not the newest the server saved, which may belong to a save the workers never
     * completed); none yet under resume: auto is a fresh start, as for the workers */
    if (rc >= 0 && sc.resume) {
        rc = fl_train_ckpt_resume_point(cfg, &sc.resume_step, sc.resume_dir,
                                        sizeof sc.resume_dir);
        if (rc >= 0 && sc.resume_step < 0) {
            sc.resume = false;
            FL_INFO("server %d: resume: auto: the workers have no checkpoint in %s yet; "
                    "starting fresh", fl_ps_server_index(ps), cfg->checkpoint.dir);
        }
    }
    if (rc >= 0) {
        FL_INFO("server %d of %d (%s): %s mode, %d threads%s%s", fl_ps_server_index(ps),
                fl_ps_server_num(ps), fl_ps_server_endpoint(ps, fl_ps_server_index(ps)),
                fl_ps_mode_name(sc.mode), sc.threads, sc.checkpoint_dir[0] ? ", shards in " : "",
                sc.checkpoint_dir);
        rc = fl_ps_init_server(ps, &sc);
    }
    if (rc >= 0) {
        *started = true; /* a failure from here on is one fleetrun --max_restarts restarts */
        rc = fl_ps_run_server(ps);
    }
    if (rc < 0)
        rc = fl_fail_prefix(rc, "server %d", fl_ps_server_index(ps));
    else
        FL_INFO("server %d: every worker has finished", fl_ps_server_index(ps));
    fl_ps_free(ps);
    return rc;
}

int fl_train_ps_join(trainer *t, const fl_train_config *cfg) {
    FL_TRY(fl_ps_init(&t->ps));
    if (!fl_ps_is_worker(t->ps))
        return fl_fail(FL_ECONFIG, "TRAINING_ROLE: this process is not a trainer");
    if (fl_ps_worker_index(t->ps) != t->rank || fl_ps_worker_num(t->ps) != t->world)
        return fl_fail(FL_ECONFIG, "PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM say worker %d of %d, "
                                   "but the workers' communicator says %d of %d",
                       fl_ps_worker_index(t->ps), fl_ps_worker_num(t->ps), t->rank, t->world);
    fl_ps_mode mode = mode_of(&cfg->strategy);
    /* the servers check that they loaded the step this worker resumes from */
    int64_t step;
    char root[1024];
    FL_TRY(fl_train_ckpt_resume_point(cfg, &step, root, sizeof root));
    fl_ps_set_resume_step(t->ps, step);
    FL_TRY(fl_ps_init_worker(t->ps, mode));
    fl_fleet_set_ps(t->fleet, t->ps);
    if (t->rank == 0)
        FL_INFO("parameter-server mode: %d workers, %d servers, %s", t->world,
                fl_ps_server_num(t->ps), fl_ps_mode_name(mode));
    return FL_OK;
}

void fl_train_ps_leave(trainer *t) {
    if (!t->ps)
        return;
    /* a failure that ended training is what fleet-train reports, not what stopping then says
     * about the same broken connection */
    char kept[1024];
    snprintf(kept, sizeof kept, "%s", fl_errmsg());
    if (fl_ps_stop_worker(t->ps) < 0) {
        FL_WARN("parameter-server mode: %s", fl_errmsg());
        if (kept[0])
            fl_fail(FL_EPEER, "%s", kept);
    }
    fl_ps_free(t->ps);
    t->ps = NULL;
}
