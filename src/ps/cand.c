/* cand.c - the candidates of a sparse table under entry COUNT (cand.h): an open-addressing
 * map of (id, shows seen, passes unseen) with linear probing, doubled past 3/4 full, entries
 * deleted by backward shift so that no tombstones accumulate. */
#include "cand.h"

#include <stdlib.h>
#include <string.h>

#define MIN_BITS 8

/* MurmurHash3's fmix64 (Appleby) with its own seed. */
static inline uint64_t cand_hash(uint64_t id) {
    uint64_t z = id ^ 0x6a09e667f3bcc909ull;
    z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
    z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ull;
    return z ^ (z >> 33);
}

static inline uint64_t home(const ps_cand *c, uint64_t id) {
    return cand_hash(id) >> (64 - c->bits);
}

static void place(ps_cand_entry *e, int bits, const ps_cand_entry *x) {
    uint64_t mask = ((uint64_t)1 << bits) - 1, p = cand_hash(x->id) >> (64 - bits);
    while (e[p].used)
        p = (p + 1) & mask;
    e[p] = *x;
}

/* A map of 2^bits entries holding c's entries that keep(); -1 when out of memory. */
static int rebuild(ps_cand *c, int bits, int max_unseen) {
    ps_cand_entry *e = calloc((size_t)1 << bits, sizeof *e);
    if (!e)
        return -1;
    int64_t used = 0;
    for (uint64_t i = 0; c->e && i < (uint64_t)1 << c->bits; i++) {
        ps_cand_entry x = c->e[i];
        if (!x.used || (max_unseen > 0 && x.unseen >= max_unseen))
            continue;
        if (max_unseen >= 0 && x.unseen < UINT16_MAX)
            x.unseen++;
        place(e, bits, &x);
        used++;
    }
    free(c->e);
    c->e = e;
    c->bits = bits;
    c->used = used;
    return 0;
}

ps_cand_entry *ps_cand_get(ps_cand *c, uint64_t id, bool create) {
    if (c->e) {
        uint64_t mask = ((uint64_t)1 << c->bits) - 1;
        for (uint64_t p = home(c, id); c->e[p].used; p = (p + 1) & mask)
            if (c->e[p].id == id)
                return &c->e[p];
    }
    if (!create)
        return NULL;
    if (!c->e || c->used + 1 > (int64_t)(((uint64_t)3 << c->bits) / 4))
        if (rebuild(c, c->e ? c->bits + 1 : MIN_BITS, -1) < 0)
            return NULL;
    uint64_t mask = ((uint64_t)1 << c->bits) - 1, p = home(c, id);
    while (c->e[p].used)
        p = (p + 1) & mask;
    c->e[p] = (ps_cand_entry){.id = id, .used = 1};
    c->used++;
    return &c->e[p];
}

void ps_cand_remove(ps_cand *c, ps_cand_entry *e) {
    uint64_t mask = ((uint64_t)1 << c->bits) - 1, p = (uint64_t)(e - c->e), q = p;
    for (;;) {
        q = (q + 1) & mask;
        if (!c->e[q].used)
            break;
        uint64_t h = home(c, c->e[q].id);
        /* the entry at q may move to the hole at p unless its home lies cyclically in (p, q] */
        bool stays = p <= q ? (h > p && h <= q) : (h > p || h <= q);
        if (!stays) {
            c->e[p] = c->e[q];
            p = q;
        }
    }
    c->e[p].used = 0;
    c->used--;
}

int64_t ps_cand_pass(ps_cand *c, int max_unseen) {
    if (!c->e)
        return 0;
    int64_t keep = 0;
    for (uint64_t i = 0; i < (uint64_t)1 << c->bits; i++)
        keep += c->e[i].used && !(max_unseen > 0 && c->e[i].unseen >= max_unseen);
    int bits = MIN_BITS;
    while (keep + 1 > (int64_t)(((uint64_t)3 << bits) / 8) && bits < c->bits)
        bits++; /* the smallest map at most 3/8 full, never larger than now */
    int64_t before = c->used;
    if (rebuild(c, bits, max_unseen) < 0)
        return -1;
    return before - c->used;
}

int ps_cand_visit(const ps_cand *c, int (*fn)(void *ctx, const ps_cand_entry *e), void *ctx) {
    for (uint64_t i = 0; c->e && i < (uint64_t)1 << c->bits; i++)
        if (c->e[i].used) {
            int rc = fn(ctx, &c->e[i]);
            if (rc)
                return rc;
        }
    return 0;
}

void ps_cand_clear(ps_cand *c) {
    free(c->e);
    memset(c, 0, sizeof *c);
}

size_t ps_cand_bytes(const ps_cand *c) {
    return c->e ? sizeof *c->e << c->bits : 0;
}
