/* `cscs run`: the engine with its built-in closed-loop load generator. */
#ifndef CSCS_RUN_H
#define CSCS_RUN_H

#include <stddef.h>
#include <stdint.h>

struct run_options {
    size_t tuples;
    double seconds;       /* stop after this long (0: no limit) */
    uint64_t max_batches; /* stop after this many batches (0: no limit) */
    uint64_t seed;
    double sla_ms;        /* 0: none */
    double think_ms;      /* --think-ms: the load generator's pause between batches */
    size_t batch_queries, batch_updates;
    int naive;
    const int *cpus;      /* --cores; NULL: every CPU this process may use */
    size_t ncpus;
    const char *csv_path;
    const char *results_path;
    const char *schedule;     /* --cores-schedule */
    const char *control_path; /* --control FIFO */
    const char *socket_path;  /* --socket: run under COD */
    const char *cost_fn_path;
    const char *cod_name;     /* --name: the task and application under COD (NULL: "cscs") */
    int no_numa_binding;
    size_t max_cores;         /* --max-cores: under COD, at most this many (0: every CPU allowed) */
};

/* Returns the process exit status. */
int cscs_run(const struct run_options *o);

#endif
