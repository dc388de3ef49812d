/* The seam where COD plugs into CSCS.  Everything the engine needs from
 * COD goes through these four calls; the engine does not know libcod.
 *
 * cod_glue.c implements them over libcod (clients/c), and the Makefile links
 * it whenever libcod can be built (GLUE=libcod); cod_glue_stub.c, which has
 * no COD and refuses --socket, is linked with GLUE=stub (and into the C unit
 * tests, which do not talk to a daemon). */
#ifndef CSCS_COD_GLUE_H
#define CSCS_COD_GLUE_H

#include <stddef.h>

#include "plan.h"

struct glue_config {
    const char *socket;       /* the RM's socket; NULL: run without COD */
    const char *name;         /* the task's and application's name (NULL: "cscs") */
    const char *cost_fn_path; /* Prolog text of db_cost_fn/4 (cscs calibrate) */
    size_t ntuples;
    size_t tuple_bytes;
    size_t batch_queries, batch_updates;
    double sla_ms;
    int max_cores;            /* CPUs this process may use */
};

struct cod_glue;

/* As the paper's Listing 1: connect to the RM, register the task,
 * push the system facts (max_cores, CPU-bound, cache- and NUMA-sensitive)
 * and the application facts (db_ntuple, db_tsize, db_nquery, db_nupdate,
 * db_rtime, the cost function), register the requirements as derived
 * properties over dbos_cost_function/3 (Listing 3), and wait for the first
 * allocation upcall: its cores come back in *cpus (malloc'ed).
 * Returns 0 with *out = NULL when cfg->socket is NULL (no COD), 0 with a
 * live glue, or -1 with a message in err. */
int cod_glue_open(const struct glue_config *cfg, struct cod_glue **out, int **cpus,
                  size_t *ncpus, char *err, size_t errlen);

/* Before every scan phase: if an allocation upcall is pending,
 * ask the SKB for the tuple redistribution onto the new cores,
 * cscs_redistribute(Current, Cores, Status, Parts, Moves) of
 * stored_procedures/cscs.pl, with `cur` as Current, and return it in *plan.
 * Returns 1 with a plan to apply, 0 when nothing changed, -1 on error. */
int cod_glue_poll(struct cod_glue *g, const struct plan_part *cur, size_t ncur,
                  struct plan *plan, char *err, size_t errlen);

/* After the plan of the last poll was applied (ok = 1) or refused (ok = 0).
 * ack_allocation with the upcall's epoch, so the RM hands the
 * cores we gave up to their new owner at once instead of at the deadline. */
void cod_glue_applied(struct cod_glue *g, int ok);

void cod_glue_close(struct cod_glue *g);

#endif
