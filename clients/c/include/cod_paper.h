/* The COD paper's names (Table 2 and Listing 1) as a thin layer over cod.h.
 *
 * Include this only where you want these short, unprefixed names: they are static inline
 * functions (nothing is exported from libcod for them), and the property and value names
 * of Listing 1 (maxCores, bound, CPU, cache, NUMA, ...) are enumeration constants.
 *
 *   cod_conn *c = rsmgr_client_connect(COD_USE_SKB);    // $COD_SOCKET, app $COD_APP
 *   rsmgr_register_function(c, "cscs", on_allocation, NULL);
 *   skb_client_connect(c);
 *   skb_system_fact(c, maxCores, MAX_CORES);
 *   skb_system_fact(c, bound, CPU);
 *   skb_system_fact(c, sensitive, cache);
 *   skb_system_fact(c, sensitive, NUMA);
 *   skb_add_fact(c, "db_ntuple(%d)", 3750000);
 *   skb_add_fn(c, "db_cost_fn(X, Y, Z, N) :- N is (X * ((0.47 * Y) + 265.29)) / (3750000 * Z).");
 *   cod_reply *r = skb_execute_query(c, "dbos_cost_function(Status, NrCores, PartSize)");
 */
#ifndef COD_PAPER_H
#define COD_PAPER_H

#include <stdlib.h>
#include <string.h>

#include "cod.h"

#ifdef __cplusplus
extern "C" {
#endif

/* rsmgr_client_connect(use_skb): COD_USE_SKB also sends queries straight to the SKB server
 * when the daemon offers it; 0 sends everything through the RM. */
enum { COD_USE_RM_ONLY = 0, COD_USE_SKB = 1 };

/* The system-level properties of Listing 1, lines 6-9, and the values they take. */
typedef enum skb_property { minCores, maxCores, workingSetSize, bound, sensitive, exclusive, priority } skb_property;
enum {
    MAX_CORES = -1,   /* maxCores: every core of the machine (the daemon's default) */
    CPU = -2,         /* bound */
    MEMORY = -3,      /* bound */
    cache = -4,       /* sensitive */
    NUMA = -5         /* sensitive */
};

/* Table 2, "Core functions": connect to the RM (and through it, the SKB).  The socket is
 * $COD_SOCKET (else the default); the application namespace $COD_APP (else the daemon's). */
static inline cod_conn *rsmgr_client_connect(int use_skb)
{
    const char *app = getenv("COD_APP");
    cod_conn *c = cod_connect(NULL, app && *app ? app : NULL);
    if (c)
        cod_set_direct(c, use_skb);
    return c;
}

/* Registers the calling process as the task name; on_allocation gets its allocation upcalls. */
static inline int rsmgr_register_function(cod_conn *c, const char *name, cod_event_fn on_allocation, void *userdata)
{
    cod_task *t = cod_task_new(name);
    if (!t)
        return COD_ENOMEM;
    int rc = cod_register_task(c, t, on_allocation, userdata, NULL);
    cod_task_free(t);
    return rc;
}

/* One connection carries both the RM and the SKB: this checks that it is up. */
static inline int skb_client_connect(cod_conn *c) { return cod_is_connected(c) ? 0 : COD_ECONN; }

static inline int skb_paper_first(const char *key, const cod_value *val, void *userdata)
{
    (void)key;
    *(const cod_value **)userdata = val;
    return 1;
}

/* A system-level property of the connection's task (Listing 1, lines 6-9); the daemon
 * re-plans with it.  Sensitivities accumulate. */
static inline int skb_system_fact(cod_conn *c, skb_property property, long long value)
{
    cod_task *t = cod_task_new(NULL);
    if (!t)
        return COD_ENOMEM;
    int rc = COD_EINVAL;
    switch (property) {
    case minCores: rc = cod_task_set_int(t, COD_MIN_CORES, value); break;
    case maxCores:
        if (value == MAX_CORES) {
            cod_reply *r = cod_query(c, "get_list_free_cpus(L)");
            rc = r ? cod_task_set_int(t, COD_MAX_CORES, (long long)cod_value_length(cod_reply_get(r, 0, "L")))
                   : cod_errcode(c);
            cod_reply_free(r);
        } else {
            rc = cod_task_set_int(t, COD_MAX_CORES, value);
        }
        break;
    case workingSetSize: rc = cod_task_set_int(t, COD_WORKING_SET_BYTES, value); break;
    case priority: rc = cod_task_set_int(t, COD_PRIORITY, value); break;
    case exclusive: rc = cod_task_set_bool(t, COD_EXCLUSIVE, value != 0); break;
    case bound:
        rc = value == CPU ? cod_task_set_string(t, COD_BOUND, "cpu")
             : value == MEMORY ? cod_task_set_string(t, COD_BOUND, "memory") : COD_EINVAL;
        break;
    case sensitive: {
        /* The sensitivities the task holds so far, plus this one. */
        const char *what = value == cache ? "cache" : value == NUMA ? "numa" : NULL;
        cod_reply *held = what ? cod_held_state(c) : NULL;
        const cod_value *tasks = cod_value_get(cod_reply_result(held), "tasks");
        rc = !what ? COD_EINVAL : cod_value_length(tasks) == 1 ? 0 : COD_ENOENT;
        const cod_value *task = NULL;
        if (rc == 0)
            cod_value_foreach(tasks, skb_paper_first, &task);
        const cod_value *had = cod_value_get(cod_value_get(task, "properties"), "sensitive");
        for (size_t k = 0; rc == 0 && k < cod_value_length(had); k++) {
            const char *s = cod_value_string(cod_value_at(had, k), NULL);
            if (s && strcmp(s, what) != 0)
                rc = cod_task_add_string(t, COD_SENSITIVE, s);
        }
        if (rc == 0)
            rc = cod_task_add_string(t, COD_SENSITIVE, what);
        cod_reply_free(held);
        break;
    }
    }
    if (rc == 0)
        rc = cod_update_task(c, t, NULL);
    cod_task_free(t);
    return rc;
}

/* Table 2, "Add facts". */
static inline int skb_add_fact(cod_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = cod_vadd_fact(c, fmt, ap);
    va_end(ap);
    return rc;
}
static inline int add_fact(cod_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = cod_vadd_fact(c, fmt, ap);
    va_end(ap);
    return rc;
}

/* Table 2, "Add CSCS-specific function": a stored procedure. */
static inline int skb_add_fn(cod_conn *c, const char *text) { return cod_add_procedure(c, text); }
static inline int add_query(cod_conn *c, const char *text) { return cod_add_procedure(c, text); }

/* Table 2, "Query system-specific info" and "Query CSCS-specific function". */
static inline cod_reply *skb_execute_query(cod_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cod_reply *r = cod_vquery(c, fmt, ap);
    va_end(ap);
    return r;
}
static inline cod_reply *execute_query(cod_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cod_reply *r = cod_vquery(c, fmt, ap);
    va_end(ap);
    return r;
}

/* Table 2, "(De-)Register for notification". */
static inline int rsmgr_register_fn(cod_conn *c, const char *event, const char *const *filter, cod_event_fn handler,
                                    void *userdata)
{
    return cod_subscribe(c, event, filter, handler, userdata);
}
static inline int rsmgr_deregister_fn(cod_conn *c, int subscription) { return cod_unsubscribe(c, subscription); }

#ifdef __cplusplus
}
#endif
#endif /* COD_PAPER_H */
