/* scratch.c - the algorithms' growable scratch buffer (scratch.h). */
#include "scratch.h"

#include "fleet/status.h"
#include "fleet/tensor.h"

void *fl_scratch_get(fl_scratch *s, size_t nbytes) {
    if (nbytes <= s->cap && s->data)
        return s->data;
    /* grow by at least half again, so a slowly growing bucket size reallocates rarely */
    size_t want = nbytes;
    if (want < s->cap + s->cap / 2)
        want = s->cap + s->cap / 2;
    if (want < 4096)
        want = 4096;
    void *p = fl_alloc_aligned(want);
    if (!p) {
        fl_fail(FL_ENOMEM, "comm: out of memory for a %zu-byte scratch buffer", want);
        return NULL;
    }
    fl_free_aligned(s->data);
    s->data = p;
    s->cap = want;
    return p;
}

void fl_scratch_free(fl_scratch *s) {
    fl_free_aligned(s->data);
    s->data = NULL;
    s->cap = 0;
}
