/* A reconfiguration plan: the scan threads' cores after the change, the
 * tuples each one's partition holds, and the moves of tuples between
 * partitions that get there.  A plan comes either from COD's tuple
 * redistribution stored procedure (cscs_redistribute/5 in
 * stored_procedures/cscs.pl) or from plan_even() below; the engine applies
 * either the same way (engine_apply_plan). */
#ifndef CSCS_PLAN_H
#define CSCS_PLAN_H

#include <stddef.h>

struct plan_part {
    int cpu;
    size_t tuples;
};

/* `tuples` tuples of `from`'s partition move to `to`'s (which ones is the
 * engine's choice: tuples have no order in a partition). */
struct plan_move {
    int from, to;
    size_t tuples;
};

struct plan {
    struct plan_part *parts; /* the new partitions, one per core */
    size_t nparts;
    struct plan_move *moves;
    size_t nmoves;
};

void plan_free(struct plan *p);

/* The default plan onto `cpus`: every partition gets an equal share (the
 * remainder goes one tuple each to the cores listed first); tuples leave
 * the partitions that shrink or go away, in the order of `cur`, for the
 * ones that grow, in the order of `cpus`.  No topology preference: that is
 * the stored procedure's job.  Returns 0, or -1 with a message in err. */
int plan_even(const struct plan_part *cur, size_t ncur, const int *cpus, size_t ncpus,
              struct plan *out, char *err, size_t errlen);

/* Check that applying `p` to the partitions `cur` is consistent: distinct
 * cores, every move between a shrinking and a growing partition, every
 * partition ending at its size, no tuple lost.  Returns 0 or -1 with err. */
int plan_check(const struct plan_part *cur, size_t ncur, const struct plan *p,
               char *err, size_t errlen);

/* Parse the text form: "CPU:N[,CPU:N...] [moves FROM>TO:N[,FROM>TO:N...]]". */
int plan_parse(const char *text, struct plan *out, char *err, size_t errlen);
/* Format the parts as "CPU:N,..." */
int plan_format_parts(const struct plan_part *parts, size_t n, char *buf, size_t len);

#endif
