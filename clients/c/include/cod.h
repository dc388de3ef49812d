/* libcod: the C client of the COD Resource Manager and its System Knowledge Base.
 *
 * The wire protocol is docs/protocol.md; the guide with examples is docs/cclient.md.
 *
 *   cod_conn *c = cod_connect(NULL, "cscs");          // $COD_SOCKET or the default socket
 *   cod_add_fact(c, "db_rtime(%d)", 3000);
 *   cod_reply *r = cod_query(c, "dbos_cost_function(S, N, P)");
 *   long long n;
 *   if (r && cod_reply_count(r) > 0 && cod_value_int(cod_reply_get(r, 0, "N"), &n) == 0) ...
 *   cod_reply_free(r);
 *   cod_free(c);
 *
 * Conventions
 *   - Calls returning int give 0 (or a count or id, where stated) on success and a negative
 *     COD_E... code on failure.  Calls returning a pointer give NULL on failure.  After a
 *     failure, cod_errstr() says what was wrong as a sentence and cod_server_code() gives the
 *     daemon's JSON-RPC code when the daemon refused the call.
 *   - No fixed-size buffers: every string, list and answer is as long as the daemon sends.
 *   - Text you pass is UTF-8.  Formatting calls (cod_add_fact, cod_query, ...) take a Prolog
 *     template with printf-like conversions that always produce a single Prolog token, so a
 *     value can never inject a goal:
 *         %d %i %u %x (with hh h l ll z j t)   an integer
 *         %f %g %e (and l)                     a float, in Prolog float syntax (finite only)
 *         %s                                   an atom, quoted when needed (cod_quote_atom)
 *         %q                                   a Prolog string literal "..." (cod_quote_string)
 *         %%                                   a percent sign
 *     Widths, precisions and flags are refused (COD_EINVAL).  Calls without "fmt" send text as is.
 *
 * Thread safety
 *   A cod_conn may be shared by threads.  Calls on one connection are serialized by the
 *   connection's lock: one request is on the wire at a time, the others wait their turn
 *   (the daemon serves one connection's requests in order anyway; open one connection per
 *   thread when queries should run in parallel).  Different connections share nothing.
 *   cod_errstr(), cod_errcode(), cod_server_code() and cod_server_data() report the last
 *   failed call *of the calling thread* on that connection.
 *   Upcall handlers never run inside another call: they run in the thread that calls
 *   cod_dispatch() or cod_wait_event(), without the connection's lock held, so a handler may
 *   call any function of the connection (cod_ack_allocation from an allocation handler is the
 *   usual case) except cod_free().  cod_dispatch() never waits for the lock: when another
 *   thread is in a call, it runs the upcalls already received and returns.
 *   cod_reply, cod_task, cod_batch and cod_allocation objects belong to one thread at a time.
 *
 * Reconnection
 *   The connection remembers what the application holds on the daemon: its facts (the
 *   current set: facts later removed are forgotten), its stored procedures (a newer text
 *   defining the same predicates replaces an older one), its subscriptions and its tasks
 *   with their current properties.  cod_reconnect() opens a new connection and sends all of
 *   it again, compacted; in COD_RECONNECT_AUTO mode a call or cod_dispatch() on a lost
 *   connection does so by itself.  Subscription ids stay the same across reconnections.
 *   A call in flight when the daemon dies fails with COD_ECONN (it is not retried: it may
 *   or may not have taken effect); the daemon is never waited for past the call's timeout.
 */
#ifndef COD_H
#define COD_H

#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COD_VERSION "0.1.0"
#define COD_PROTOCOL_VERSION 1

#if defined(__GNUC__)
#define COD_EXPORT __attribute__((visibility("default")))
#else
#define COD_EXPORT
#endif

/* ---- errors ----------------------------------------------------------------------------- */
enum cod_error {
    COD_OK = 0,
    /* Found by the client. */
    COD_EINVAL = -1,         /* a bad argument: NULL, a bad conversion, text not UTF-8, a float not finite */
    COD_ENOMEM = -2,         /* out of memory */
    COD_ECONN = -3,          /* not connected, or the connection was lost during the call */
    COD_ETIMEOUT = -4,       /* no reply within the call's timeout (cod_set_timeout) */
    COD_EPROTO = -5,         /* the daemon sent something that is not the protocol */
    COD_ETOOBIG = -6,        /* the request is larger than the daemon's max_frame_bytes */
    COD_ETYPE = -7,          /* a value is not of the type asked for */
    COD_ERANGE = -8,         /* an integer does not fit in the C type asked for */
    COD_EREPLAY = -9,        /* reconnected, but the daemon refused part of the state on replay */
    /* Refused by the daemon: cod_server_code() has its exact code, cod_errstr() its message. */
    COD_EREQUEST = -20,      /* -32700, -32600: the daemon could not read the request */
    COD_EMETHOD = -21,       /* -32601: unknown method */
    COD_EPARAMS = -22,       /* -32602: a missing, mistyped or unknown parameter, a bad property */
    COD_EINTERNAL = -23,     /* -32603: a daemon bug */
    COD_EHELLO = -24,        /* -32000: hello required first */
    COD_EVERSION = -25,      /* -32001: the daemon does not speak this protocol version */
    COD_EPERM = -26,         /* -32010: permission denied */
    COD_ENOENT = -27,        /* -32020: no such task, process or subscription */
    COD_EEXIST = -28,        /* -32021: a task of that name exists */
    COD_EADMISSION = -29,    /* -32030: admission refused (cod_server_data: requested, free, reason) */
    COD_ESKB = -30,          /* -32043..-32051: another error of the knowledge base (data.skb_code), e.g. an
                                answer larger than the frame limit (-32043, "too large") */
    COD_ESYNTAX = -31,       /* -32040: syntax error in a fact, procedure or goal */
    COD_EUNSAFE = -32,       /* -32041: the goal calls something the sandbox refuses */
    COD_EQUERYTIME = -33,    /* -32042: the query ran past its time limit */
    COD_ESHUTDOWN = -34,     /* -32060: the daemon is shutting down */
    COD_EBUSY = -35,         /* -32070: the daemon is too busy */
    COD_ESERVER = -36,       /* any other code the daemon sends (e.g. new ones in -32000..-32099) */
    COD_EQUOTA = -37,        /* -32031, -32052: over a quota (facts, procedures, subscriptions) */
    COD_ESLOW = -38,         /* -32071: this client was too slow (no hello, a frame not completed in time) */
    COD_ECANCELLED = -39,    /* -32053: the query was stopped by a `cancel` call of its own connection */
    COD_ESYSTEM = -40,       /* the kernel refused a call libcod makes itself (errno says why) */
    COD_EUNKNOWN = -41       /* -32080, or a write whose whole request left and whose reply did not come (the
                                call's timeout, a lost connection): it may or may not take effect; cod_retry */
};

/* The name of a COD_E... code as a short phrase ("connection lost", ...). */
COD_EXPORT const char *cod_strerror(int code);
/* The COD_E... code for a daemon's JSON-RPC error code. */
COD_EXPORT int cod_error_from_server(long long server_code);

/* ---- values ------------------------------------------------------------------------------ */
/* A value of an answer, an event or a result.  Owned by its cod_reply or cod_event. */
typedef struct cod_value cod_value;

typedef enum cod_type {
    COD_NULL = 0,   /* an unbound variable in an answer; JSON null elsewhere; also a NULL value */
    COD_BOOL,
    COD_INT,        /* fits in long long */
    COD_BIGINT,     /* a Prolog integer beyond 64 bits: cod_value_bigint gives its digits */
    COD_FLOAT,
    COD_STRING,     /* a Prolog atom or string (may contain NUL bytes: use the length) */
    COD_LIST,       /* a proper list ([] is the empty list) */
    COD_COMPOUND,   /* a compound term: functor and arguments (a partial list is '[|]'(H, T)) */
    COD_OBJECT      /* a JSON object of the protocol (an answer's solution, an event's fields) */
} cod_type;

COD_EXPORT cod_type cod_value_type(const cod_value *v);
COD_EXPORT int cod_value_int(const cod_value *v, long long *out);          /* 0, COD_ETYPE or COD_ERANGE (bigint) */
COD_EXPORT int cod_value_float(const cod_value *v, double *out);          /* floats and integers; else COD_ETYPE */
COD_EXPORT int cod_value_bool(const cod_value *v, int *out);
COD_EXPORT const char *cod_value_string(const cod_value *v, size_t *len); /* NULL if not a string */
COD_EXPORT const char *cod_value_bigint(const cod_value *v);              /* decimal digits of COD_BIGINT, else NULL */
COD_EXPORT size_t cod_value_length(const cod_value *v);   /* elements of a list, arguments of a compound, members of an object */
COD_EXPORT const cod_value *cod_value_at(const cod_value *v, size_t i); /* list element or compound argument i */
COD_EXPORT const char *cod_value_functor(const cod_value *v);           /* NULL unless COD_COMPOUND */
COD_EXPORT const cod_value *cod_value_get(const cod_value *v, const char *key); /* an object's member */
/* Calls fn(key, value, userdata) for every member of an object, in order; stops at a nonzero return. */
COD_EXPORT int cod_value_foreach(const cod_value *v, int (*fn)(const char *key, const cod_value *val, void *userdata),
                                 void *userdata);
/* A list of integers (e.g. CPU numbers) as a malloc'd array; *n its length.  0 or COD_ETYPE/COD_ERANGE/COD_ENOMEM. */
COD_EXPORT int cod_value_int_list(const cod_value *v, int **out, size_t *n);
/* The value as compact JSON text (malloc'd; free() it).  NULL on ENOMEM. */
COD_EXPORT char *cod_value_json(const cod_value *v);

/* ---- connection ---------------------------------------------------------------------------- */
typedef struct cod_conn cod_conn;

/* Connects and says hello.  NULL path: $COD_SOCKET, else /run/cod/rm.sock for root, else
 * $XDG_RUNTIME_DIR/cod/rm.sock.  NULL app: the daemon's default (pid<PID>).  NULL on failure,
 * errno set (ENOENT/ECONNREFUSED: no daemon; EACCES: refused; EPROTO: not the protocol) and
 * cod_connect_error() says why. */
COD_EXPORT cod_conn *cod_connect(const char *socket_path, const char *app);
COD_EXPORT const char *cod_connect_error(void);  /* why this thread's last cod_connect failed */
COD_EXPORT void cod_free(cod_conn *c);           /* hangs up: the daemon drops this connection's tasks and facts */

COD_EXPORT const char *cod_errstr(const cod_conn *c);           /* last error (of this thread) as a sentence */
COD_EXPORT int cod_errcode(const cod_conn *c);                  /* its COD_E... code, 0 if none */
COD_EXPORT long long cod_server_code(const cod_conn *c);        /* the daemon's code, 0 if the client failed */
COD_EXPORT const cod_value *cod_server_data(const cod_conn *c); /* the error's data object, or NULL;
                                                                  valid until this thread's next failure on c */

COD_EXPORT const char *cod_app(const cod_conn *c);              /* the application namespace the daemon gave */
COD_EXPORT int cod_set_timeout(cod_conn *c, int timeout_ms);    /* per call; default 60000; <= 0: none */

enum cod_reconnect_mode {
    COD_RECONNECT_MANUAL = 0, /* default: a lost connection stays lost until cod_reconnect() */
    COD_RECONNECT_AUTO = 1    /* calls, cod_dispatch and cod_wait_event reconnect and replay by themselves */
};
/* timeout_ms: how long one reconnection keeps trying while the daemon is away (default 10000). */
COD_EXPORT int cod_set_reconnect(cod_conn *c, int mode, int timeout_ms);
/* Reconnects now (even if the connection looks fine) and replays the held state.
 * 0; COD_ECONN if no daemon answered in time; COD_EREPLAY if part of the state was refused
 * (cod_errstr says what; that part is dropped from the held state). */
COD_EXPORT int cod_reconnect(cod_conn *c);
COD_EXPORT int cod_is_connected(const cod_conn *c); /* a hint: the daemon may have gone since */
/* Direct query channel: when the daemon offers it in its hello, queries go straight to the
 * SKB server (one hop); everything else goes through the RM.  On by default. */
COD_EXPORT int cod_set_direct(cod_conn *c, int enabled);
COD_EXPORT int cod_is_direct(const cod_conn *c);  /* 1 when queries currently use the direct channel */

/* ---- replies --------------------------------------------------------------------------------- */
typedef struct cod_reply cod_reply;

/* A query: all solutions (up to the daemon's limit of 10,000).  NULL on error. */
COD_EXPORT cod_reply *cod_query(cod_conn *c, const char *fmt, ...);
COD_EXPORT cod_reply *cod_vquery(cod_conn *c, const char *fmt, va_list ap);

typedef struct cod_query_opts {
    int first_only;     /* nonzero: stop at the first solution */
    int max_solutions;  /* 0: the daemon's default (10,000) */
    double timeout_s;   /* 0: the daemon's default (5 s, its upper bound) */
} cod_query_opts;
/* goal is sent as is (no conversions); opts may be NULL. */
COD_EXPORT cod_reply *cod_query_goal(cod_conn *c, const char *goal, const cod_query_opts *opts);

COD_EXPORT size_t cod_reply_count(const cod_reply *r);            /* solutions */
COD_EXPORT const cod_value *cod_reply_get(const cod_reply *r, size_t solution, const char *var);
COD_EXPORT const cod_value *cod_reply_solution(const cod_reply *r, size_t solution); /* COD_OBJECT: var -> value */
COD_EXPORT const cod_value *cod_reply_result(const cod_reply *r); /* the whole JSON-RPC result */
COD_EXPORT void cod_reply_free(cod_reply *r);

/* Any method, params as JSON object text (NULL: none).  The result is cod_reply_result().
 * Calls that change what the application holds (facts, procedures, tasks, subscriptions)
 * are remembered for reconnection as if made through the typed calls. */
COD_EXPORT cod_reply *cod_call(cod_conn *c, const char *method, const char *params_json);
/* The daemon's hello result (protocol, server, app, machine, ...), as a reply to free. */
COD_EXPORT cod_reply *cod_server_info(cod_conn *c);
/* What this connection holds on the daemon and would send again on reconnection, as a reply
 * whose result is {"facts": [...], "system_facts": [...], "procedures": [...],
 * "subscriptions": [{"id", "event", "filter"}], "tasks": {name: {"name", "properties", "pid"?}}}. */
COD_EXPORT cod_reply *cod_held_state(cod_conn *c);

/* ---- Prolog text ------------------------------------------------------------------------------ */
/* text as a Prolog atom: unquoted if it is a plain lower-case identifier, else in single quotes
 * with \\, \' and control characters escaped.  malloc'd; NULL (errno EINVAL) if not UTF-8. */
COD_EXPORT char *cod_quote_atom(const char *text);
COD_EXPORT char *cod_quote_string(const char *text); /* text as a Prolog string literal "..." */
/* The Prolog text a formatting call sends (see Conventions).  malloc'd; NULL with errno set. */
COD_EXPORT char *cod_format(const char *fmt, ...);
COD_EXPORT char *cod_vformat(const char *fmt, va_list ap);

/* ---- facts and procedures -------------------------------------------------------------------- */
enum cod_flags {
    COD_SYSTEM = 1,     /* system-level facts, visible to every application (privileged peers only) */
    COD_PERSISTENT = 2  /* kept by the daemon after this connection closes */
};
COD_EXPORT int cod_add_fact(cod_conn *c, const char *fmt, ...);
COD_EXPORT int cod_vadd_fact(cod_conn *c, const char *fmt, va_list ap);
COD_EXPORT int cod_add_facts(cod_conn *c, const char *const *facts, size_t n); /* one frame, all or nothing */
COD_EXPORT int cod_add_facts_flags(cod_conn *c, const char *const *facts, size_t n, int flags);
/* Retracts every fact unifying with the pattern (e.g. "db_rtime(_)"); returns how many (>= 0). */
COD_EXPORT int cod_remove_facts(cod_conn *c, const char *fmt, ...);
COD_EXPORT int cod_remove_facts_flags(cod_conn *c, int flags, const char *pattern);
COD_EXPORT int cod_add_procedure(cod_conn *c, const char *text);
COD_EXPORT int cod_add_procedure_flags(cod_conn *c, const char *text, int flags);

/* ---- write outcomes (docs/protocol.md, "Write outcomes") -------------------------------------
 * Each call above sends a fresh request key (128 random bits).  COD_EUNKNOWN says the write may or
 * may not take effect (the daemon could not tell in time, or its reply did not come); a failure
 * with any other code means it did not and will not.  cod_retry sends this thread's last write
 * again, if its outcome was unknown, with the same key: the daemon answers with the first run's
 * outcome instead of writing twice (on the same connection, within its limits: 256 keys, 10 min).
 * It returns what the write's own call returns (0; cod_remove_facts: how many went), or
 * COD_EUNKNOWN again while the write is still under way; COD_EINVAL when there is none.
 * cod_call of a write with a "request_key" in its params is kept for cod_retry the same way. */
COD_EXPORT int cod_retry(cod_conn *c);
/* The request key of this thread's write whose outcome is unknown, or NULL (valid until this
 * thread's next write on c). */
COD_EXPORT const char *cod_request_key(const cod_conn *c);

/* ---- events -------------------------------------------------------------------------------------- */
typedef struct cod_event cod_event;
/* A handler: runs in the thread calling cod_dispatch/cod_wait_event; ev lives until it returns. */
typedef void (*cod_event_fn)(cod_conn *c, const cod_event *ev, void *userdata);

COD_EXPORT const char *cod_event_name(const cod_event *ev);   /* "allocation_changed", "task_left", ... */
COD_EXPORT int cod_event_subscription(const cod_event *ev);   /* the id cod_subscribe returned; 0 for task and connection events */
COD_EXPORT const cod_value *cod_event_get(const cod_event *ev, const char *key);
COD_EXPORT const cod_value *cod_event_params(const cod_event *ev); /* every field, as an object */

/* Subscribes to event ("allocation_changed", "task_arrived", "task_left", "facts_changed",
 * "condition").
 * filter: NULL, or key/value pairs ending in NULL, e.g. {"task", "db", "task", "olap", NULL}:
 * a key given several times matches any of its values.  "condition" needs the filter
 * {"goal", GOAL, NULL}: a goal over the SKB; its upcalls carry "goal", "state" (bool) and, when
 * true, "bindings", on each change of its truth (docs/protocol.md, "Conditions").
 * Returns the subscription id (> 0). */
COD_EXPORT int cod_subscribe(cod_conn *c, const char *event, const char *const *filter, cod_event_fn fn,
                             void *userdata);
COD_EXPORT int cod_unsubscribe(cod_conn *c, int subscription);
/* Connection events: "shutdown" (the daemon said it is stopping: field "reason"), "disconnected",
 * "reconnected" (field "replay_errors": how many held items the daemon refused). */
COD_EXPORT int cod_on_connection(cod_conn *c, cod_event_fn fn, void *userdata);

/* For an event loop: a descriptor that polls readable when cod_dispatch has work (upcalls
 * arrived or queued, or an automatic reconnection is due).  It stays the same across reconnections. */
COD_EXPORT int cod_fd(const cod_conn *c);
/* Reads what arrived without blocking and runs the handlers; returns how many ran (>= 0) or
 * a negative COD_E... (COD_ECONN once the daemon has gone, in manual mode). */
COD_EXPORT int cod_dispatch(cod_conn *c);
/* Waits up to timeout_ms (< 0: forever) for upcalls and runs their handlers: > 0 ran, 0 timed out. */
COD_EXPORT int cod_wait_event(cod_conn *c, int timeout_ms);

/* ---- tasks and allocations --------------------------------------------------------------------- */
typedef struct cod_allocation {
    char *task;
    char *app;
    long long epoch;            /* the epoch in which cores was announced */
    int *cores;                 /* Linux CPU numbers, ascending */
    size_t ncores;
    int *numa_nodes;
    size_t nnuma_nodes;
    int *memory_nodes;
    size_t nmemory_nodes;
    int *releasing;             /* CPUs taken from the task that it has not yet given back */
    size_t nreleasing;
    int *added;                 /* upcalls: CPUs gained since the previous announcement */
    size_t nadded;
    int *removed;               /* upcalls: CPUs to give up before deadline_s (then cod_ack_allocation) */
    size_t nremoved;
    double deadline_s;          /* upcalls with removed CPUs; else -1 */
    char *reason;               /* upcalls: why the allocation changed; else NULL */
} cod_allocation;
/* Calls filling a cod_allocation want it zeroed (cod_allocation a = {0};) or holding an earlier
 * result, which they free first; cod_allocation_clear frees the members and zeroes it. */
COD_EXPORT void cod_allocation_clear(cod_allocation *a);

/* A task description for cod_register_task, or the changes for cod_update_task. */
typedef struct cod_task cod_task;
#define COD_MIN_CORES "min_cores"
#define COD_MAX_CORES "max_cores"
#define COD_WORKING_SET_BYTES "working_set_bytes"
#define COD_BOUND "bound"             /* "cpu" or "memory" */
#define COD_SENSITIVE "sensitive"     /* list of "numa", "cache" */
#define COD_EXCLUSIVE "exclusive"
#define COD_PRIORITY "priority"
#define COD_POLLUTES_CACHE "pollutes_cache"
#define COD_ALLOW_SMT_SHARING "allow_smt_sharing"

COD_EXPORT cod_task *cod_task_new(const char *name); /* name NULL in updates: the connection's only task */
COD_EXPORT void cod_task_free(cod_task *t);
COD_EXPORT int cod_task_set_pid(cod_task *t, pid_t pid);     /* default: the calling process */
COD_EXPORT int cod_task_set_int(cod_task *t, const char *property, long long value);
COD_EXPORT int cod_task_set_bool(cod_task *t, const char *property, int value);
COD_EXPORT int cod_task_set_string(cod_task *t, const char *property, const char *value);
COD_EXPORT int cod_task_add_string(cod_task *t, const char *property, const char *value); /* appends to a list */
/* A numeric property derived by the SKB: {"query": query, "var": var} (the daemon evaluates it). */
COD_EXPORT int cod_task_set_derived(cod_task *t, const char *property, const char *query, const char *var);
COD_EXPORT int cod_task_add_fact(cod_task *t, const char *fact);       /* sent with the registration */
COD_EXPORT int cod_task_add_procedure(cod_task *t, const char *text);  /* sent with the registration */
COD_EXPORT int cod_task_set_persistent(cod_task *t, int persistent);   /* for those facts and procedures */

/* Registers a task.  on_allocation (may be NULL) gets every allocation_changed upcall of it,
 * the first one included; out (may be NULL) receives the first allocation. */
COD_EXPORT int cod_register_task(cod_conn *c, const cod_task *t, cod_event_fn on_allocation, void *userdata,
                                 cod_allocation *out);
COD_EXPORT int cod_update_task(cod_conn *c, const cod_task *changes, cod_allocation *out);
COD_EXPORT int cod_deregister_task(cod_conn *c, const char *task);  /* NULL: the only task */
COD_EXPORT int cod_get_allocation(cod_conn *c, const char *task, cod_allocation *out);
COD_EXPORT int cod_request_allocation(cod_conn *c, const char *task, cod_allocation *out);
COD_EXPORT int cod_ack_allocation(cod_conn *c, const char *task, long long epoch);
/* The latest allocation of task heard so far (from replies and upcalls), without a call. */
COD_EXPORT int cod_last_allocation(cod_conn *c, const char *task, cod_allocation *out);
/* The allocation carried by an allocation_changed event. */
COD_EXPORT int cod_event_allocation(const cod_event *ev, cod_allocation *out);

/* ---- memory: where the task's new pages go (docs/design-enforce.md) --------------------------------
 * In cpuset mode the kernel keeps a task's new pages on its nodes; in affinity mode nothing does
 * but the process itself.  These apply an allocation's memory_nodes (from a reply, an upcall or
 * cod_last_allocation); an allocation without memory nodes (no CPU yet) changes nothing (0).
 * The daemon moves the pages already resident, in batches; these calls move none. */
#define COD_MEM_PREFERRED 1   /* MPOL_PREFERRED: the first memory node, others when it is full */
#define COD_MEM_BIND 2        /* MPOL_BIND: only the memory nodes */
#define COD_MEM_INTERLEAVE 3  /* MPOL_INTERLEAVE: page by page over the memory nodes */
/* The calling thread's new pages (set_mempolicy(2)): a policy belongs to the thread that sets it,
 * so each worker thread calls this, e.g. when it sees a new epoch.  COD_EINVAL for a bad mode or
 * allocation, COD_ESYSTEM when the kernel refuses (errno). */
COD_EXPORT int cod_bind_thread_memory(const cod_allocation *a, int mode);
/* The pages of [addr, addr + len) (mbind(2); addr page-aligned), whichever thread touches them:
 * for a buffer pool, call it from the allocation handler. */
COD_EXPORT int cod_bind_memory_range(void *addr, size_t len, const cod_allocation *a, int mode);

/* ---- batch ---------------------------------------------------------------------------------------- */
typedef struct cod_batch cod_batch;
COD_EXPORT cod_batch *cod_batch_new(void);
COD_EXPORT void cod_batch_free(cod_batch *b);
COD_EXPORT int cod_batch_add(cod_batch *b, const char *method, const char *params_json);
COD_EXPORT int cod_batch_add_facts(cod_batch *b, const char *const *facts, size_t n, int flags);
COD_EXPORT int cod_batch_add_procedure(cod_batch *b, const char *text, int flags);
COD_EXPORT int cod_batch_query(cod_batch *b, const char *fmt, ...);
/* Runs the calls in one round trip.  NULL if the batch as a whole failed; otherwise each
 * call's outcome is read with cod_batch_count/cod_batch_result/cod_batch_error. */
COD_EXPORT cod_reply *cod_batch_run(cod_conn *c, const cod_batch *b, int stop_on_error);
COD_EXPORT size_t cod_batch_count(const cod_reply *r);   /* outcomes (cut after the first error when stopping) */
COD_EXPORT const cod_value *cod_batch_result(const cod_reply *r, size_t i); /* NULL if call i failed */
/* 0 if call i succeeded; else its COD_E... code, with the daemon's code and message if wanted. */
COD_EXPORT int cod_batch_error(const cod_reply *r, size_t i, long long *server_code, const char **message);

#ifdef __cplusplus
}
#endif
#endif /* COD_H */
