/* Changes of cores that do not come from COD: a schedule given on the
 * command line (--cores-schedule) and a control FIFO (--control).  They
 * drive the engine's runtime API in tests and experiments; COD's upcalls
 * reach the same API through cod_glue.h.
 *
 * Schedule: items separated by ';', each WHEN=WHAT, fired once, in order:
 *   WHEN  #N    before batch N (batches count from 1)
 *         Ts    once T seconds of the run have passed (e.g. 2.5s)
 *   WHAT  a CPU list (0-3,8): spread the tuples evenly over those cores
 *         plan CPU:N,...[ moves FROM>TO:N,...]: an explicit plan
 *   e.g.  "#3=0;#5=0-1"   or   "10s=1;20s=plan 0:500,1:500 moves 1>0:500"
 * FIFO lines: "cores LIST", "plan ...", or "stop" (end the run after the
 * current batch). */
#ifndef CSCS_CONTROL_H
#define CSCS_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

enum control_kind { CONTROL_NONE, CONTROL_CORES, CONTROL_PLAN, CONTROL_STOP };

struct control_cmd {
    enum control_kind kind;
    int *cpus; /* CONTROL_CORES */
    size_t ncpus;
    struct plan plan; /* CONTROL_PLAN */
    char source[160]; /* where it came from, for the log */
};

struct control;

int control_open(const char *schedule, const char *fifo_path, struct control **out,
                 char *err, size_t errlen);
/* The next change due before batch `batch_no` at `elapsed` seconds, if any:
 * returns 1 and fills cmd, 0 if none, -1 with err for a malformed FIFO
 * line (which is dropped; the caller reports it and goes on). */
int control_poll(struct control *c, uint64_t batch_no, double elapsed, struct control_cmd *cmd,
                 char *err, size_t errlen);
void control_cmd_free(struct control_cmd *cmd);
void control_close(struct control *c);

/* Parse one WHAT (a CPU list, or "plan ..."). */
int control_parse_what(const char *text, struct control_cmd *cmd, char *err, size_t errlen);

#endif
