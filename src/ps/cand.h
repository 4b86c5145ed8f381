/* cand.h - the candidates of a sparse table under entry COUNT (fl_ps_sparse_opts): ids seen in
 * pushes that have no row yet, each with the shows counted so far and the passes since it was
 * last seen. A small open-addressing map with linear probing whose 16-byte entries hold the id
 * itself, so a candidate costs no row; deleted with backward shift (Knuth, TAOCP vol. 3, 6.4,
 * algorithm R), pruned at each pass by rebuilding. Not thread-safe: one per table part. */
#ifndef FLEET_PS_CAND_H
#define FLEET_PS_CAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t id;
    float    seen;    /* shows counted */
    uint16_t unseen;  /* passes since the last push that counted it */
    uint16_t used;    /* 0: an empty entry */
} ps_cand_entry;

typedef struct {
    ps_cand_entry *e; /* [1 << bits], NULL while empty */
    int            bits;
    int64_t        used;
} ps_cand;

/* The entry of id; absent: NULL, or with create a fresh one (seen 0, unseen 0), NULL only
 * when memory runs out. A pointer stays valid until the next create, remove or prune. */
ps_cand_entry *ps_cand_get(ps_cand *c, uint64_t id, bool create);
/* Removes e (a pointer ps_cand_get returned). */
void    ps_cand_remove(ps_cand *c, ps_cand_entry *e);
/* One pass: drops the candidates unseen for max_unseen passes (max_unseen > 0), counts one
 * more unseen pass for the others. Returns the number dropped, or -1 when memory for the
 * smaller map runs out (then nothing changed). */
int64_t ps_cand_pass(ps_cand *c, int max_unseen);
/* Visits the candidates in map order (fn returns nonzero to stop; returned). */
int     ps_cand_visit(const ps_cand *c, int (*fn)(void *ctx, const ps_cand_entry *e), void *ctx);
void    ps_cand_clear(ps_cand *c);
size_t  ps_cand_bytes(const ps_cand *c);

#endif /* FLEET_PS_CAND_H */
