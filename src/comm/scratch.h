/* scratch.h - one growable buffer per communicator for the algorithms' temporaries (the ring's
 * incoming segment, recursive doubling's partner buffer): allocated on first use, grown (never
 * shrunk) when a collective needs more, freed with the communicator. Private to src/comm. */
#ifndef FLEET_SCRATCH_H
#define FLEET_SCRATCH_H

#include <stddef.h>

typedef struct {
    void  *data;
    size_t cap;
} fl_scratch;

/* Returns a buffer of at least nbytes (NULL with FL_ENOMEM's message when out of memory). */
void *fl_scratch_get(fl_scratch *s, size_t nbytes);
void  fl_scratch_free(fl_scratch *s);

#endif /* FLEET_SCRATCH_H */
