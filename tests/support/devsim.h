/* devsim.h - a guarded stand-in for a device backend, for tests on machines without a GPU: the
 * cpu table with host_memory false, whose memory the host cannot touch outside the table's
 * own calls. Each allocation is its own mmap'd pages, PROT_NONE except while a table function
 * runs; so host code that reads or writes backend memory directly (instead of copying it with
 * the table's copy) dies with SIGSEGV, and a handler names the allocation, its size, where it
 * was allocated and where the host touched it. Every table function also checks that the data
 * pointers it is given are backend memory (backend.h's memory rule), so host memory passed to
 * the "device" aborts with the function and argument named. Results are the cpu table's, bit
 * for bit (FLEET_DEVSIM_TABLE=ref: the ref table's, whose low dtypes and convert devsim then
 * has too, so that native f16 / bf16 activations run under the memory rule; docs/amp.md).
 * Streams made with stream_create are lazy: their copies run only when an event
 * recorded after them is waited for or the stream is synced (the default stream runs
 * everything at once), so a read of a staging buffer that forgot to wait finds stale data, and
 * freeing memory a queued copy uses aborts.
 *
 * Test-only: it is not in fl_backend_by_name's registry. A test program uses it directly, or
 * installs it as the trainer's GPU backend (fl_train_set_gpu_backend, train.h) and runs with
 * train.device: gpu; fleet-train-devsim and fleet-eval-devsim are fleet-train and fleet-eval
 * built that way (tests/support/CMakeLists.txt). */
#ifndef FLEET_TESTS_DEVSIM_H
#define FLEET_TESTS_DEVSIM_H

#include "fleet/backend.h"

#include <stdbool.h>
#include <stddef.h>

/* The table (one per process; installs the SIGSEGV handler on first use). device_bind accepts
 * ordinals 0 .. FL_DEVSIM_DEVICES - 1; memory_peak is the most bytes allocated at once. */
#define FL_DEVSIM_DEVICES 8
const fl_backend *fl_devsim_backend(void);

/* Whether p points into a live allocation of the table. */
bool fl_devsim_owns(const void *p);
/* Bytes and allocations live now. */
size_t fl_devsim_live_bytes(void);
int    fl_devsim_live_count(void);
/* The ordinal device_bind was last given (-1: never called). */
int    fl_devsim_bound(void);

#endif /* FLEET_TESTS_DEVSIM_H */
