/* The COD paper's Listing 1 in C, with the paper's own names (cod_paper.h).
 *
 * CSCS binds to the RM and the SKB (lines 1-4), registers its system-level properties
 * (lines 6-9), pushes its facts and cost function (lines 11-17), runs the deployment stored
 * procedure of Listing 3 (shipped in stored_procedures/; line 20), turns its outcome into
 * the task's core count, and receives the allocation upcall with the concrete cores.
 *
 *   listing1 [--socket PATH] [--sla-ms 3000] [--timeout 10]
 *
 * Each line of output is "title: JSON".  Exit status 0; 2 when the machine cannot meet
 * the SLA; 1 on an error.
 *
 * Built as a user builds it: cc -std=c11 listing1.c $(pkg-config --cflags --libs cod).  Strict C11
 * declares neither clock_gettime nor setenv: POSIX.1-2008 is asked for here, before any header.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cod_paper.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct cscs {
    double t_connect;
    double first_upcall_ms; /* connect -> first allocation upcall handled; < 0 until then */
    long long epoch;        /* of the latest upcall */
    size_t ncores;
} cscs;

static void print_ints(const char *name, const int *v, size_t n, int last)
{
    printf("\"%s\": [", name);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", v[i]);
    printf("]%s", last ? "" : ", ");
}

/* The allocation upcall: a storage engine moves its scan threads off the cores being
 * taken away, then acknowledges so the RM may hand them on. */
static void on_allocation(cod_conn *c, const cod_event *ev, void *userdata)
{
    cscs *s = userdata;
    cod_allocation a = {0};
    if (cod_event_allocation(ev, &a) != 0)
        return;
    if (s->first_upcall_ms < 0)
        s->first_upcall_ms = now_ms() - s->t_connect;
    printf("upcall allocation_changed: {\"epoch\": %lld, ", a.epoch);
    print_ints("cores", a.cores, a.ncores, 0);
    print_ints("numa_nodes", a.numa_nodes, a.nnuma_nodes, 0);
    print_ints("added", a.added, a.nadded, 0);
    print_ints("removed", a.removed, a.nremoved, 0);
    char *reason = cod_value_json(cod_event_get(ev, "reason"));
    printf("\"reason\": %s}\n", reason ? reason : "null");
    free(reason);
    if (a.nremoved)
        cod_ack_allocation(c, NULL, a.epoch);
    s->epoch = a.epoch;
    s->ncores = a.ncores;
    cod_allocation_clear(&a);
}

static int fail(cod_conn *c, const char *what)
{
    fprintf(stderr, "listing1: %s: %s\n", what, c ? cod_errstr(c) : cod_connect_error());
    cod_free(c);
    return 1;
}

/* The command line; 0, or 1 after the usage line. */
static int parse_args(int argc, char **argv, int *sla_ms, double *timeout_s)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
            setenv("COD_SOCKET", argv[++i], 1);
        else if (strcmp(argv[i], "--sla-ms") == 0 && i + 1 < argc)
            *sla_ms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
            *timeout_s = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--socket PATH] [--sla-ms MS] [--timeout S]\n", argv[0]);
            return 1;
        }
    }
    return 0;
}

/* The steps below return 0, or the exit status with the connection already freed. */

/* Lines 1-4: bind to the RM and the SKB. */
static int bind_rm_and_skb(cscs *state, cod_conn **out)
{
    state->t_connect = now_ms();
    cod_conn *c = rsmgr_client_connect(COD_USE_SKB);
    if (!c)
        return fail(NULL, "connecting");
    if (rsmgr_register_function(c, "cscs", on_allocation, state) != 0)
        return fail(c, "registering");
    cod_dispatch(c); /* the first allocation upcall, sent with the registration */
    if (skb_client_connect(c) != 0)
        return fail(c, "the SKB");
    cod_reply *info = cod_server_info(c);
    char *machine = cod_value_json(cod_value_get(cod_reply_result(info), "machine"));
    printf("connected: {\"machine\": %s, \"app\": \"%s\", \"direct_skb\": %s}\n", machine, cod_app(c),
           cod_is_direct(c) ? "true" : "false");
    free(machine);
    cod_reply_free(info);
    *out = c;
    return 0;
}

/* Lines 6-17: the system-level properties, then the dataset, the workload and the cost
 * function of Section 4.4. */
static int push_properties_and_facts(cod_conn *c, int sla_ms)
{
    /* Lines 6-9: system-level properties. */
    if (skb_system_fact(c, maxCores, MAX_CORES) || skb_system_fact(c, bound, CPU) ||
        skb_system_fact(c, sensitive, cache) || skb_system_fact(c, sensitive, NUMA))
        return fail(c, "system-level properties");

    /* Lines 11-17: the dataset, the workload and the cost function of Section 4.4. */
    if (skb_add_fact(c, "db_ntuple(%d)", 3750000) || skb_add_fact(c, "db_tsize(%d)", 315) ||
        skb_add_fact(c, "db_nquery(%d)", 2048) || skb_add_fact(c, "db_nupdate(%d)", 256) ||
        skb_add_fact(c, "db_rtime(%d)", sla_ms))
        return fail(c, "facts");
    const char *cost_fn = "db_cost_fn(X, Y, Z, NrCores) :- NrCores is (X * ((0.47 * Y) + 265.29)) / (3750000 * Z).";
    if (skb_add_fn(c, cost_fn))
        return fail(c, "cost function");
    printf("facts pushed: [\"db_ntuple(3750000)\", \"db_tsize(315)\", \"db_nquery(2048)\", \"db_nupdate(256)\", "
           "\"db_rtime(%d)\", \"%s\"]\n",
           sla_ms, cost_fn);
    return 0;
}

/* Line 19: the stored procedure of Listing 3 is in the SKB's library (stored_procedures/).
 * Line 20: run it; *ncores is the core count it derived.  2 when the SLA cannot be met. */
static int run_deployment_procedure(cod_conn *c, long long *ncores)
{
    cod_reply *r = skb_execute_query(c, "dbos_cost_function(Status, NrCores, PartSize)");
    if (!r)
        return fail(c, "the deployment procedure");
    if (cod_reply_count(r) == 0) {
        cod_reply_free(r);
        fprintf(stderr, "listing1: the deployment procedure failed: the SKB lacks a fact it needs\n");
        cod_free(c);
        return 1;
    }
    long long status = -1;
    cod_value_int(cod_reply_get(r, 0, "Status"), &status);
    cod_value_int(cod_reply_get(r, 0, "NrCores"), ncores);
    char *sol = cod_value_json(cod_reply_solution(r, 0));
    printf("deployment derived by the SKB: %s\n", sol);
    free(sol);
    cod_reply_free(r);
    if (status != 0) {
        fprintf(stderr, "listing1: this machine cannot meet the SLA: %s\n",
                status == 1 ? "not enough free cores" : "the dataset does not fit in free memory");
        cod_free(c);
        return 2;
    }
    return 0;
}

/* The procedure's outcome becomes the task's properties; the RM re-plans and sends the
 * upcall with the concrete cores, awaited here until the timeout. */
static int await_allocation_upcall(cod_conn *c, cscs *state, long long ncores, double timeout_s)
{
    if (skb_system_fact(c, minCores, ncores) || skb_system_fact(c, maxCores, ncores))
        return fail(c, "the core count");
    cod_allocation a = {0};
    if (cod_get_allocation(c, NULL, &a))
        return fail(c, "the allocation");
    long long want_epoch = a.epoch;
    cod_allocation_clear(&a);
    double deadline = now_ms() + timeout_s * 1000;
    while (!(state->epoch >= want_epoch && state->ncores == (size_t)ncores) && now_ms() < deadline)
        cod_wait_event(c, 100);
    if (state->ncores != (size_t)ncores) {
        fprintf(stderr, "listing1: no allocation upcall with %lld cores within %.1f s\n", ncores, timeout_s);
        cod_free(c);
        return 1;
    }
    return 0;
}

/* The allocation as the library last heard it, and the time to the first upcall. */
static int print_allocation_heard(cod_conn *c, const cscs *state)
{
    cod_allocation a = {0};
    if (cod_last_allocation(c, "cscs", &a))
        return fail(c, "the allocation heard");
    printf("allocation: {\"epoch\": %lld, ", a.epoch);
    print_ints("cores", a.cores, a.ncores, 0);
    print_ints("numa_nodes", a.numa_nodes, a.nnuma_nodes, 0);
    print_ints("memory_nodes", a.memory_nodes, a.nmemory_nodes, 1);
    printf("}\n");
    printf("timing: {\"connect_to_first_upcall_ms\": %.3f}\n", state->first_upcall_ms);
    cod_allocation_clear(&a);
    return 0;
}

int main(int argc, char **argv)
{
    int sla_ms = 3000;
    double timeout_s = 10;
    if (parse_args(argc, argv, &sla_ms, &timeout_s))
        return 1;
    setenv("COD_APP", "cscs", 0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    cscs state = {.first_upcall_ms = -1, .epoch = -1};

    cod_conn *c = NULL;
    long long ncores = 0;
    int rc = bind_rm_and_skb(&state, &c);
    if (!rc)
        rc = push_properties_and_facts(c, sla_ms);
    if (!rc)
        rc = run_deployment_procedure(c, &ncores);
    if (!rc)
        rc = await_allocation_upcall(c, &state, ncores, timeout_s);
    if (!rc)
        rc = print_allocation_heard(c, &state);
    if (rc)
        return rc; /* the step that failed freed the connection */
    cod_free(c);
    return 0;
}
