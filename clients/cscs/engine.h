/* The CSCS engine: one scan thread per core, pinned there, each owning a
 * horizontal partition bound to that core's NUMA node; all threads scan
 * their partition against the same batch, then a merge step gathers the
 * answer (COD paper, Section 4).
 *
 * The runtime API changes the set of cores between scan phases: it starts
 * and stops scan threads and moves tuples between partitions (and so
 * between NUMA nodes) following a plan (plan.h).  Not thread-safe: one
 * coordinating thread calls everything here. */
#ifndef CSCS_ENGINE_H
#define CSCS_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "plan.h"

struct engine_config {
    uint64_t seed;
    size_t ntuples;
    const int *cpus; /* initial cores, one scan thread each */
    size_t ncpus;
    int no_numa_binding; /* leave memory to the default policy */
};

struct batch_stats {
    size_t cores;
    double index_ms;    /* building the predicate index */
    double scan_max_ms; /* the slowest scan thread: what the batch waits for */
    double scan_min_ms;
    double scan_max_cpu_ms; /* the largest CPU time of a scan thread: the
                               scan on cores of its own, without time other
                               processes held them */
    double merge_ms;
    size_t matches, updated;
};

struct reconfig_stats {
    double ms;
    size_t tuples_moved;
    size_t chunks_handed_over; /* moved whole, without copying */
    size_t threads_started, threads_stopped;
};

struct engine;

int engine_create(const struct engine_config *cfg, struct engine **out, char *err, size_t errlen);
void engine_destroy(struct engine *e);

/* One scan phase: every scan thread scans its partition against `b`
 * (indexed here), then the merge step fills `out`. */
int engine_run_batch(struct engine *e, struct batch *b, struct batch_output *out,
                     struct batch_stats *st, char *err, size_t errlen);

/* The current partitions, in scan-thread order (malloc'ed array). */
int engine_layout(const struct engine *e, struct plan_part **parts, size_t *n);
size_t engine_ncores(const struct engine *e);
uint64_t engine_nkeys(const struct engine *e);
size_t engine_ntuples(const struct engine *e);

/* Between scan phases: move to the partitions of `p` (checked against the
 * current layout first; a refused plan changes nothing). */
int engine_apply_plan(struct engine *e, const struct plan *p, struct reconfig_stats *st,
                      char *err, size_t errlen);
/* The same with plan_even() onto `cpus`. */
int engine_set_cores(struct engine *e, const int *cpus, size_t n, struct reconfig_stats *st,
                     char *err, size_t errlen);

#endif
