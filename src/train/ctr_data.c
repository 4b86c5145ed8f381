/* ctr_data.c - the CTR trainer's data sources: ctr_synth's samples, sliced as fl_loader slices
 * global batches (step g of an epoch is samples [g W B, (g + 1) W B), worker r the r-th B of
 * them, so W workers see the single worker's batch of W B), or Criteo text files through ctr.h's
 * reader (its own prefetch thread; data.shard says how the workers split the list). */
#include "train/ctr_impl.h"

#include <math.h>
#include <string.h>

int ctr_source_open(ctr_source *s, const fl_train_config *cfg, int split, int rank, int world,
                    int64_t B, bool *present) {
    memset(s, 0, sizeof *s);
    s->B = B;
    s->rank = rank;
    s->world = world;
    *present = false;
    if (cfg->data.type == FL_DATA_CTR_SYNTH) {
        int64_t size = split == 0 ? cfg->data.train_size : cfg->data.val_size;
        if (size == 0)
            return FL_OK;
        s->steps = size / (B * world);
        if (s->steps < 1)
            return fl_fail(FL_ECONFIG, "data.%s: %lld samples make no batch of %lld x %d "
                                       "workers", split == 0 ? "train_size" : "val_size",
                           (long long)size, (long long)B, world);
        fl_ctr_synth_config sc = fl_ctr_synth_config_default();
        sc.seed = (uint64_t)cfg->data.seed;
        sc.split = split;
        sc.vocab = cfg->data.vocab;
        sc.zipf = cfg->data.zipf;
        sc.max_ids = (int)cfg->data.max_ids;
        sc.ctr = cfg->data.ctr;
        sc.transform = (fl_ctr_dense_transform)cfg->data.transform;
        if (!(s->synth = fl_ctr_synth_create(&sc)))
            return fl_fail_prefix(FL_ECONFIG, "data (ctr_synth)");
        FL_TRY(fl_ctr_batch_init(&s->buf, sc.ndense, sc.nslots, B, B * sc.nslots));
        *present = true;
        return FL_OK;
    }
    const char *list = split == 0 ? cfg->data.train_list : cfg->data.val_list;
    if (!list[0])
        return FL_OK;
    fl_criteo_config rc = fl_criteo_config_default();
    rc.file_list = list;
    rc.format.transform = (fl_ctr_dense_transform)cfg->data.transform;
    rc.format.missing_id = cfg->data.missing_id;
    rc.batch_size = B;
    rc.rank = rank;
    rc.world = world;
    rc.shard = (fl_ctr_shard)cfg->data.shard;
    rc.bad_lines = (fl_bad_lines_policy)cfg->data.bad_lines;
    rc.prefetch = true;
    if (!(s->rd = fl_criteo_open(&rc)))
        return fl_fail_prefix(FL_ECONFIG, "data.%s", split == 0 ? "train_list" : "val_list");
    s->steps = -1;
    *present = true;
    return FL_OK;
}

void ctr_source_close(ctr_source *s) {
    fl_ctr_synth_free(s->synth);
    fl_criteo_close(s->rd);
    fl_ctr_batch_free(&s->buf);
    memset(s, 0, sizeof *s);
}

int ctr_source_seek(ctr_source *s, int64_t skip) {
    s->next = 0;
    if (s->rd)
        FL_TRY(fl_criteo_rewind(s->rd));
    if (s->synth) {
        s->next = skip < s->steps ? skip : s->steps;
        return FL_OK;
    }
    const fl_ctr_batch *b;
    for (int64_t i = 0; i < skip; i++) {
        int rc = ctr_source_next(s, &b);
        FL_TRY(rc);
        if (rc == 0)
            break;
    }
    return FL_OK;
}

int ctr_source_next(ctr_source *s, const fl_ctr_batch **b) {
    if (s->synth) {
        if (s->next >= s->steps)
            return 0;
        FL_TRY(fl_ctr_synth_batch(s->synth, s->next, s->rank, s->world, s->B, &s->buf));
        s->next++;
        *b = &s->buf;
        return 1;
    }
    int rc = fl_criteo_next(s->rd, b);
    if (rc == 1)
        s->next++;
    return rc;
}
