/* devsim_impl.h - what devsim's files share beyond devsim.h: the guard's checks and the window
 * in which a kernel may touch backend memory (devsim.c), and the installers with which
 * devsim_table.c assembles the table (devsim.c's memory, streams and device; devsim_ops.c's
 * compute ops). Layered devsim_table.c -> devsim_ops.c -> devsim.c: nothing calls back up. */
#ifndef FLEET_TESTS_DEVSIM_IMPL_H
#define FLEET_TESTS_DEVSIM_IMPL_H

#include "fleet/backend.h"

#include <stddef.h>
#include <stdint.h>

/* ds_check_dev's size for an argument whose extent the wrapper does not work out (a
 * convolution's arrays: the plan knows them): its whole allocation is opened, only its start
 * checked */
#define SPAN_UNKNOWN SIZE_MAX

/* Argument arg of table function fn must be `bytes` of backend memory (0: nothing to check);
 * its pages open at the next ds_enter. Aborts naming fn and arg otherwise. */
void ds_check_dev(const char *fn, const char *arg, const void *p, size_t bytes);
/* Argument arg of fn is host memory: aborts naming them if p is backend memory. */
void ds_check_host(const char *fn, const char *arg, const void *p);
/* Around a kernel: ds_enter opens the pages the checks collected (under devsim's one recursive
 * lock), ds_leave closes them again. */
void ds_enter(void);
void ds_leave(void);

/* devsim.c: the lock, the page size and the SIGSEGV handler; `kernels` runs the copies. */
void ds_guard_init(const fl_backend *kernels);
/* devsim.c: host_memory false, alloc, free, copy, streams, events, device_bind, memory_peak. */
void ds_install_memory(fl_backend *t);
/* devsim_ops.c: every compute op of t, each the checked wrapper of kernels' (convert only where
 * kernels has one). */
void ds_install_ops(fl_backend *t, const fl_backend *kernels);

#endif
