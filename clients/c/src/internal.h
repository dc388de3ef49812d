/* libcod internals shared by the source files; not installed. */
#ifndef COD_INTERNAL_H
#define COD_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>

#include "cod.h"
#include "reader.h"

#define COD_HIDDEN __attribute__((visibility("hidden")))

/* ---- UTF-8 (utf8.c) ---- */
COD_HIDDEN int cod_utf8_valid(const char *s, size_t n); /* 1: valid UTF-8 (no surrogates, no overlong forms) */

/* ---- a growable byte buffer (buf.c) ---- */
typedef struct cod_buf {
    char *p;
    size_t len, cap;
} cod_buf;

COD_HIDDEN int cod_buf_reserve(cod_buf *b, size_t extra);        /* 0 or COD_ENOMEM */
COD_HIDDEN int cod_buf_append(cod_buf *b, const void *s, size_t n);
COD_HIDDEN int cod_buf_puts(cod_buf *b, const char *s);
COD_HIDDEN int cod_buf_putc(cod_buf *b, char ch);
COD_HIDDEN int cod_buf_printf(cod_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
COD_HIDDEN char *cod_buf_take(cod_buf *b);                      /* NUL-terminated; the buffer is emptied */
COD_HIDDEN void cod_buf_free(cod_buf *b);
COD_HIDDEN int cod_buf_dump_json(cod_buf *b, const json_t *v);   /* compact JSON appended */
COD_HIDDEN int cod_buf_json_string(cod_buf *b, const char *s, size_t n); /* a JSON string; COD_EINVAL if not UTF-8 */

/* ---- Prolog text (prolog.c) ---- */
COD_HIDDEN int cod_quote_atom_to(cod_buf *b, const char *s, size_t n);
COD_HIDDEN int cod_quote_string_to(cod_buf *b, const char *s, size_t n);
/* Expands a template; 0, COD_EINVAL (why in *why, malloc'd) or COD_ENOMEM. */
COD_HIDDEN int cod_vformat_to(cod_buf *b, const char *fmt, va_list ap, char **why);

/* How a remove_facts pattern relates to a fact, decided from the text alone. */
enum cod_match { COD_MATCH_NO = 0, COD_MATCH_YES = 1, COD_MATCH_UNKNOWN = 2 };
COD_HIDDEN int cod_pattern_match(const char *pattern, const char *fact);

/* ---- values (value.c) ---- */
struct cod_reply {
    json_t *root;      /* the whole message */
    json_t *result;    /* borrowed */
    json_t *solutions; /* borrowed; NULL unless a query answer */
};
COD_HIDDEN cod_reply *cod_reply_wrap(json_t *root); /* takes root; NULL on ENOMEM or a result that is not there */
COD_HIDDEN int cod_json_ints(const json_t *v, int **out, size_t *n);
COD_HIDDEN int cod_allocation_from_json(const json_t *v, cod_allocation *out);

/* ---- the connection (conn.c, calls.c, state.c) ---- */
typedef struct cod_chan {
    int fd;           /* -1 when closed */
    int wait_ms;      /* a blocking channel's socket timeouts (0: none); COD_CHAN_NONBLOCKING if it polls */
    cod_reader rd;
} cod_chan;

#define COD_CHAN_NONBLOCKING (-1)

enum cod_sub_kind { COD_SUB_EVENT = 1, COD_SUB_TASK = 2 };

typedef struct cod_sub {
    struct cod_sub *next;
    int id;                /* local, stable across reconnections; 0 for task handlers */
    int kind;
    char *event;           /* COD_SUB_EVENT */
    json_t *filter;        /* COD_SUB_EVENT */
    long long server_id;   /* on the current connection; -1 when unknown */
    char *task;            /* COD_SUB_TASK */
    cod_event_fn fn;
    void *ud;
} cod_sub;

typedef struct cod_qevent {
    struct cod_qevent *next;
    int kind;              /* COD_SUB_EVENT, COD_SUB_TASK, or 0 for a connection event */
    int sub;               /* local subscription id (COD_SUB_EVENT) */
    char *name;
    json_t *params;
} cod_qevent;

struct cod_event {
    const char *name;
    int subscription;
    json_t *params;
};

typedef struct cod_errrec {
    struct cod_errrec *next;
    pthread_t tid;
    int code;
    long long server_code;
    char *msg;
    json_t *data;
    /* This thread's last write whose outcome is unknown (outcomes.c), for cod_retry. */
    char *unsettled_method;
    char *unsettled_params;    /* JSON text, its request_key included */
    char *unsettled_key;
} cod_errrec;

struct cod_conn {
    /* io: held for a whole call; guards the channels, ids, held state and the sub table's
     * structure.  mu: guards the event queue, handler pointers, errors and allocations heard;
     * taken briefly, never while waiting. */
    pthread_mutex_t io;
    pthread_mutex_t mu;
    char *path;
    char *app;                 /* as the daemon named it */
    cod_chan rm, skb;
    long long next_id;
    int timeout_ms;
    int reconnect_mode;
    int reconnect_timeout_ms;
    int direct_enabled;
    int direct_usable;         /* 0 after a direct failure, until the next reconnection */
    int lost;                  /* the RM connection was lost */
    double retry_at;           /* automatic mode: next reconnection attempt (monotonic s) */
    double retry_delay;
    json_t *hello;             /* the hello result */
    size_t max_frame;
    cod_buf out;
    /* events */
    int epfd, evfd, tfd;
    cod_qevent *qhead, *qtail;
    cod_sub *subs;
    int next_sub;
    cod_event_fn conn_fn;
    void *conn_ud;
    json_t *allocs;            /* task -> latest allocation heard */
    cod_errrec *errs;
    /* held state, replayed on reconnection */
    json_t *facts[2];          /* [0] app, [1] system: fact text -> persistent (bool), in order */
    json_t *procs;             /* [{"text", "persistent", "predicates"}] */
    json_t *tasks;             /* name -> register_task params (properties merged with updates) */
};

/* conn.c, errors.c */
COD_HIDDEN int cod_set_error(cod_conn *c, int code, long long server_code, json_t *data, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
COD_HIDDEN void cod_clear_error(cod_conn *c);
/* One request, its reply: 0 with *result (a new reference to the whole message; result under
 * "result"), or a negative code with the error recorded.  Takes params (may be NULL).
 * Caller holds c->io. */
COD_HIDDEN int cod_roundtrip(cod_conn *c, const char *method, json_t *params, json_t **reply);
COD_HIDDEN int cod_roundtrip_text(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply);
/* The same for a write: a reply lost after the whole request left is COD_EUNKNOWN (it may have run). */
COD_HIDDEN int cod_roundtrip_write(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply);
COD_HIDDEN int cod_roundtrip_query(cod_conn *c, json_t *params, json_t **reply);
COD_HIDDEN int cod_roundtrip_query_text(cod_conn *c, const char *params, size_t plen, json_t **reply);
COD_HIDDEN int cod_ensure_connected(cod_conn *c);  /* caller holds io; reconnects in automatic mode */
COD_HIDDEN int cod_reconnect_locked(cod_conn *c, int wait_ms);
COD_HIDDEN double cod_now(void);
COD_HIDDEN int cod_ms_left(double deadline);          /* for poll(): -1 without a deadline */
COD_HIDDEN void cod_lose(cod_conn *c);                /* the RM connection is gone */
COD_HIDDEN void cod_arm_retry(cod_conn *c, double delay_s);
COD_HIDDEN int cod_pump(cod_conn *c);                 /* reads what arrived, without waiting */

/* events.c */
COD_HIDDEN void cod_queue_event(cod_conn *c, int kind, int sub, const char *name, json_t *params);
COD_HIDDEN void cod_queue_conn_event(cod_conn *c, const char *name, json_t *params); /* takes params */
COD_HIDDEN void cod_on_upcall(cod_conn *c, cod_msg *m);

/* errors.c */
COD_HIDDEN void cod_set_connect_error(const char *msg);
COD_HIDDEN cod_errrec *cod_errrec_of(cod_conn *c, int create); /* this thread's; caller holds c->mu */
COD_HIDDEN void cod_errrec_free(cod_errrec *e);

/* outcomes.c: writes with request keys (docs/protocol.md, "Write outcomes").  One write under
 * c->io: params (JSON object text) get a fresh request_key; an unknown outcome is kept for
 * cod_retry.  0 with *reply, or the error recorded. */
COD_HIDDEN int cod_keyed_write(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply);
/* A write method through cod_call: params as given; kept for cod_retry when they hold a request_key. */
COD_HIDDEN int cod_keyed_call(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply);
COD_HIDDEN int cod_is_write_method(const char *method);
#define COD_REQUEST_KEY_LEN 33 /* 32 hex digits and the NUL */
COD_HIDDEN int cod_new_request_key(char out[COD_REQUEST_KEY_LEN]); /* 0 or COD_ESYSTEM (errno) */

/* state.c: what the application holds, from every successful call, and its replay. */
COD_HIDDEN void cod_state_note(cod_conn *c, const char *method, const json_t *params, const json_t *result);
COD_HIDDEN void cod_state_hold_facts(cod_conn *c, int scope, const char *const *facts, size_t n, int persistent);
COD_HIDDEN int cod_state_replay(cod_conn *c);      /* caller holds io, connection fresh */
COD_HIDDEN void cod_state_free(cod_conn *c);
COD_HIDDEN cod_sub *cod_sub_find_server(cod_conn *c, long long server_id);
COD_HIDDEN cod_sub *cod_sub_find_task(cod_conn *c, const char *task);

#endif
