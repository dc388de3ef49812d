/* What the application holds on the daemon, kept from every successful call, and its replay
 * after a reconnection.  Compacted: the current facts (not the history of adds and removes),
 * the procedures still in force, the live subscriptions and tasks with their current
 * properties. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

cod_sub *cod_sub_find_server(cod_conn *c, long long server_id)
{
    for (cod_sub *s = c->subs; s; s = s->next)
        if (s->kind == COD_SUB_EVENT && s->server_id == server_id)
            return s;
    return NULL;
}

cod_sub *cod_sub_find_task(cod_conn *c, const char *task)
{
    for (cod_sub *s = c->subs; s; s = s->next)
        if (s->kind == COD_SUB_TASK && strcmp(s->task, task) == 0)
            return s;
    return NULL;
}

static void sub_free(cod_sub *s)
{
    free(s->event);
    free(s->task);
    json_decref(s->filter);
    free(s);
}

static void sub_unlink(cod_conn *c, cod_sub *victim)
{
    pthread_mutex_lock(&c->mu);
    for (cod_sub **p = &c->subs; *p; p = &(*p)->next)
        if (*p == victim) {
            *p = victim->next;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    sub_free(victim);
}

void cod_state_free(cod_conn *c)
{
    while (c->subs) {
        cod_sub *s = c->subs;
        c->subs = s->next;
        sub_free(s);
    }
    json_decref(c->facts[0]);
    json_decref(c->facts[1]);
    json_decref(c->procs);
    json_decref(c->tasks);
    c->facts[0] = c->facts[1] = c->procs = c->tasks = NULL;
}

/* ---- facts ---- */

static int scope_of(const json_t *params)
{
    const char *scope = json_string_value(json_object_get(params, "scope"));
    return scope && strcmp(scope, "system") == 0;
}

/* Held once each, in the order first added; persistent once added as persistent. */
void cod_state_hold_facts(cod_conn *c, int scope, const char *const *facts, size_t n, int persistent)
{
    json_t *held = c->facts[scope];
    for (size_t i = 0; i < n; i++) {
        json_t *old = json_object_get(held, facts[i]);
        if (!old)
            json_object_set_new_nocheck(held, facts[i], json_boolean(persistent));
        else if (persistent && !json_is_true(old))
            json_object_set_new_nocheck(held, facts[i], json_true());
    }
}

static void hold_facts(cod_conn *c, int scope, const json_t *facts, int persistent)
{
    size_t i;
    json_t *f;
    json_array_foreach(facts, i, f) {
        const char *text = json_string_value(f);
        if (text)
            cod_state_hold_facts(c, scope, &text, 1, persistent);
    }
}

/* Asks the daemon which of the held facts (given as texts) unify with the pattern: its
 * reader and unification are the ones that count.  Returns a list of indexes, or NULL. */
static json_t *ask_matching(cod_conn *c, const char *pattern, json_t *texts)
{
    cod_buf g = {0};
    cod_buf_puts(&g, "findall(I, (member(I-S, [");
    size_t i;
    json_t *t;
    json_array_foreach(texts, i, t) {
        cod_buf_printf(&g, "%s%zu-", i ? "," : "", i);
        cod_quote_string_to(&g, json_string_value(t), json_string_length(t));
    }
    cod_buf_puts(&g, "]), term_string(T, S), term_string(P, ");
    cod_quote_string_to(&g, pattern, strlen(pattern));
    cod_buf_puts(&g, "), \\+ \\+ T = P), Matches)");
    json_t *reply = NULL;
    json_t *params = json_pack("{s:s%}", "goal", g.p ? g.p : "", g.len);
    cod_buf_free(&g);
    if (!params || cod_roundtrip_query(c, params, &reply))
        return NULL;
    json_t *sols = json_object_get(json_object_get(reply, "result"), "solutions");
    json_t *m = json_object_get(json_array_get(sols, 0), "Matches");
    m = json_is_array(m) ? json_incref(m) : NULL;
    json_decref(reply);
    return m;
}

/* The held facts of this scope that the pattern retracted are forgotten. */
static void forget_facts(cod_conn *c, int scope, const char *pattern)
{
    json_t *held = c->facts[scope];
    json_t *gone = json_array(), *unsure = json_array();
    if (!gone || !unsure)
        goto out;
    const char *text;
    json_t *v;
    json_object_foreach(held, text, v) {
        int m = cod_pattern_match(pattern, text);
        if (m == COD_MATCH_YES)
            json_array_append_new(gone, json_string(text));
        else if (m == COD_MATCH_UNKNOWN)
            json_array_append_new(unsure, json_string(text));
    }
    /* Texts outside the matcher's subset: ask in parts that fit a frame. */
    size_t n = json_array_size(unsure), start = 0;
    while (start < n) {
        json_t *part = json_array();
        size_t bytes = 0;
        while (part && start < n && bytes < c->max_frame / 4) {
            json_t *t = json_array_get(unsure, start++);
            bytes += json_string_length(t) * 2 + 16;
            json_array_append(part, t);
        }
        json_t *idx = part ? ask_matching(c, pattern, part) : NULL;
        size_t k;
        json_t *ix;
        json_array_foreach(idx, k, ix) {
            json_t *t = json_array_get(part, (size_t)json_integer_value(ix));
            if (t)
                json_array_append(gone, t);
        }
        json_decref(idx);
        json_decref(part);
    }
    size_t i;
    json_t *g;
    json_array_foreach(gone, i, g) json_object_del(held, json_string_value(g));
out:
    json_decref(gone);
    json_decref(unsure);
}

/* ---- procedures ---- */

/* True when every predicate of older is defined again by newer (which then replaces it). */
static int covers(const json_t *newer, const json_t *older)
{
    if (!json_is_array(newer) || !json_is_array(older) || json_array_size(older) == 0)
        return 0;
    size_t i, j;
    json_t *a, *b;
    json_array_foreach(older, i, a) {
        int found = 0;
        json_array_foreach(newer, j, b) if (json_equal(a, b)) found = 1;
        if (!found)
            return 0;
    }
    return 1;
}

static void hold_procedure(cod_conn *c, const char *text, int persistent, const json_t *predicates)
{
    for (size_t i = json_array_size(c->procs); i-- > 0;) {
        json_t *old = json_array_get(c->procs, i);
        if (covers(predicates, json_object_get(old, "predicates")) ||
            strcmp(json_string_value(json_object_get(old, "text")), text) == 0)
            json_array_remove(c->procs, i);
    }
    json_t *p = json_pack("{s:s, s:b, s:O?}", "text", text, "persistent", persistent, "predicates",
                          json_is_array(predicates) ? predicates : NULL);
    if (p)
        json_array_append_new(c->procs, p);
}

/* ---- tasks ---- */

static void forget_task(cod_conn *c, const char *name)
{
    json_object_del(c->tasks, name);
    cod_sub *s = cod_sub_find_task(c, name);
    if (s)
        sub_unlink(c, s);
    pthread_mutex_lock(&c->mu);
    json_object_del(c->allocs, name);
    pthread_mutex_unlock(&c->mu);
}

static void remember_allocation(cod_conn *c, const json_t *alloc)
{
    const char *task = json_string_value(json_object_get(alloc, "task"));
    if (!task)
        return;
    pthread_mutex_lock(&c->mu);
    json_t *old = json_object_get(c->allocs, task);
    if (!old || json_integer_value(json_object_get(alloc, "epoch")) >= json_integer_value(json_object_get(old, "epoch")))
        json_object_set_new(c->allocs, task, json_deep_copy(alloc));
    pthread_mutex_unlock(&c->mu);
}

/* A registered task: its procedures and facts held, the task kept with a copy of its
 * properties (and pid) for the replay, and the allocation the reply carried. */
static void note_register_task(cod_conn *c, const json_t *params, const json_t *result)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    int persistent = json_is_true(json_object_get(params, "persistent"));
    if (!name)
        return;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(params, "procedures"), i, p)
        if (json_is_string(p)) hold_procedure(c, json_string_value(p), persistent, NULL);
    hold_facts(c, 0, json_object_get(params, "facts"), persistent);
    json_t *props = json_object_get(params, "properties");
    json_t *task = json_pack("{s:s, s:o}", "name", name, "properties",
                             json_is_object(props) ? json_deep_copy(props) : json_object());
    json_t *pid = json_object_get(params, "pid");
    if (task && pid)
        json_object_set(task, "pid", pid);
    if (task)
        json_object_set_new(c->tasks, name, task);
    remember_allocation(c, json_object_get(result, "allocation"));
}

/* A subscription made with cod_call or a batch: replayed, but it has no handler. */
static void note_subscribe(cod_conn *c, const json_t *params, const json_t *result)
{
    json_t *sid = json_object_get(result, "subscription");
    cod_sub *s = calloc(1, sizeof *s);
    if (!s || !json_is_integer(sid)) {
        free(s);
        return;
    }
    s->kind = COD_SUB_EVENT;
    s->event = strdup(json_string_value(json_object_get(params, "event")));
    json_t *filter = json_object_get(params, "filter");
    s->filter = filter ? json_deep_copy(filter) : json_object();
    s->server_id = json_integer_value(sid);
    pthread_mutex_lock(&c->mu);
    s->id = c->next_sub++;
    s->next = c->subs;
    c->subs = s;
    pthread_mutex_unlock(&c->mu);
}

/* A batch: each call that succeeded is noted as if it had been made alone. */
static void note_batch(cod_conn *c, const json_t *params, const json_t *result)
{
    json_t *calls = json_object_get(params, "calls");
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(result, "results"), i, item) {
        json_t *call = json_array_get(calls, i);
        const char *m = json_string_value(json_object_get(call, "method"));
        json_t *r = json_object_get(item, "result");
        if (m && r && !json_object_get(item, "error")) {
            json_t *p = json_object_get(call, "params");
            json_t *empty = p ? NULL : json_object();
            cod_state_note(c, m, p ? p : empty, r);
            json_decref(empty);
        }
    }
}

void cod_state_note(cod_conn *c, const char *method, const json_t *params, const json_t *result)
{
    if (strcmp(method, "add_facts") == 0) {
        hold_facts(c, scope_of(params), json_object_get(params, "facts"),
                   json_is_true(json_object_get(params, "persistent")));
    } else if (strcmp(method, "remove_facts") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(params, "patterns"), i, p)
            if (json_is_string(p)) forget_facts(c, scope_of(params), json_string_value(p));
    } else if (strcmp(method, "add_procedure") == 0) {
        const char *text = json_string_value(json_object_get(params, "text"));
        if (text)
            hold_procedure(c, text, json_is_true(json_object_get(params, "persistent")),
                           json_object_get(result, "predicates"));
    } else if (strcmp(method, "register_task") == 0) {
        note_register_task(c, params, result);
    } else if (strcmp(method, "update_task") == 0) {
        const char *name = json_string_value(json_object_get(result, "task"));
        json_t *task = name ? json_object_get(c->tasks, name) : NULL;
        json_t *changes = json_object_get(params, "properties");
        if (task && json_is_object(changes))
            json_object_update(json_object_get(task, "properties"), changes);
        remember_allocation(c, json_object_get(result, "allocation"));
    } else if (strcmp(method, "deregister_task") == 0) {
        const char *name = json_string_value(json_object_get(result, "task"));
        if (name)
            forget_task(c, name);
    } else if (strcmp(method, "request_allocation") == 0 || strcmp(method, "get_allocation") == 0) {
        remember_allocation(c, result);
    } else if (strcmp(method, "subscribe") == 0) {
        note_subscribe(c, params, result);
    } else if (strcmp(method, "unsubscribe") == 0) {
        cod_sub *s = cod_sub_find_server(c, json_integer_value(json_object_get(params, "subscription")));
        if (s)
            sub_unlink(c, s);
    } else if (strcmp(method, "batch") == 0) {
        note_batch(c, params, result);
    }
}

/* ---- replay ---- */

enum { R_PROC = 1, R_FACTS, R_SUB, R_TASK };

/* Every call is built first, from a snapshot of the held state; then they are sent as
 * batches that fit a frame, and each outcome is applied (a refused item is dropped). */
typedef struct replay {
    cod_conn *c;
    json_t *calls;   /* [{"method", "params"}] */
    json_t *what;    /* per call: [kind, key, size] */
    int failures;
    int lost;
} replay;

static void add_call(replay *r, const char *method, json_t *params, int kind, json_t *key)
{
    /* With a request key: a call whose outcome is unknown is asked again, not dropped (settle). */
    char rkey[COD_REQUEST_KEY_LEN];
    if (params && cod_new_request_key(rkey) == 0)
        json_object_set_new(params, "request_key", json_string(rkey));
    cod_buf b = {0};
    cod_buf_dump_json(&b, params);
    size_t size = b.len + 64;
    cod_buf_free(&b);
    json_array_append_new(r->calls, json_pack("{s:s, s:o}", "method", method, "params", params));
    json_array_append_new(r->what, json_pack("[i, o, I]", kind, key ? key : json_null(), (json_int_t)size));
}

/* The outcome of a replayed call that was unknown (-32080): asked again with its key, alone, until
 * it is known or the reconnection's time is up.  A new item to free, or NULL (still unknown). */
static json_t *settle(replay *r, json_t *call)
{
    cod_conn *c = r->c;
    double deadline = cod_now() + (c->reconnect_timeout_ms > 0 ? c->reconnect_timeout_ms : 10000) / 1000.0;
    cod_buf b = {0};
    if (cod_buf_dump_json(&b, json_object_get(call, "params")))
        return NULL;
    json_t *item = NULL;
    long pause_ms = 50; /* a back-off: the daemon itself waits for the outcome before it answers */
    for (int first = 1; !item && cod_now() + pause_ms / 1000.0 < deadline; first = 0) {
        if (!first) {
            struct timespec ts = {pause_ms / 1000, (pause_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            pause_ms = pause_ms * 2 < 1000 ? pause_ms * 2 : 1000;
        }
        json_t *reply = NULL;
        int rc = cod_roundtrip_write(c, json_string_value(json_object_get(call, "method")), b.p, b.len, &reply);
        if (rc == 0) {
            item = json_pack("{s:O}", "result", json_object_get(reply, "result"));
        } else if (rc == COD_EUNKNOWN && cod_server_code(c) != -32080) {
            r->lost = 1; /* its reply went with the connection */
            break;
        } else if (rc != COD_EUNKNOWN) {
            item = json_pack("{s:{s:I, s:s}}", "error", "code", (json_int_t)cod_server_code(c), "message", cod_errstr(c));
            r->lost = rc == COD_ECONN;
        }
        json_decref(reply);
    }
    cod_buf_free(&b);
    return item;
}

static void apply(replay *r, json_t *call, json_t *what, json_t *item)
{
    cod_conn *c = r->c;
    json_t *settled = NULL;
    if (json_integer_value(json_object_get(json_object_get(item, "error"), "code")) == -32080) {
        item = settled = r->lost ? NULL : settle(r, call);
        if (!item) { /* it may have been restored: kept, and sent again at the next reconnection */
            r->failures++;
            cod_set_error(c, COD_EREPLAY, -32080, NULL, "reconnected, but whether %s was restored is not known",
                          json_string_value(json_object_get(call, "method")));
            return;
        }
    }
    int kind = (int)json_integer_value(json_array_get(what, 0));
    json_t *key = json_array_get(what, 1);
    json_t *res = json_object_get(item, "result");
    json_t *err = json_object_get(item, "error");
    if (res && !err) {
        if (kind == R_SUB) {
            for (cod_sub *s = c->subs; s; s = s->next)
                if (s->kind == COD_SUB_EVENT && s->id == json_integer_value(key))
                    s->server_id = json_integer_value(json_object_get(res, "subscription"));
        } else if (kind == R_TASK) {
            remember_allocation(c, json_object_get(res, "allocation"));
        }
        json_decref(settled);
        return;
    }
    r->failures++;
    const char *msg = json_string_value(json_object_get(err, "message"));
    long long code = json_integer_value(json_object_get(err, "code"));
    cod_set_error(c, COD_EREPLAY, code, NULL, "reconnected, but the daemon refused to restore %s: %s",
                  json_string_value(json_object_get(call, "method")), msg ? msg : "no reply");
    if (kind == R_TASK) {
        forget_task(c, json_string_value(key));
    } else if (kind == R_PROC) {
        for (size_t k = json_array_size(c->procs); k-- > 0;)
            if (json_equal(json_object_get(json_array_get(c->procs, k), "text"), key))
                json_array_remove(c->procs, k);
    } else if (kind == R_FACTS) {
        json_t *params = json_object_get(call, "params");
        int scope = scope_of(params);
        size_t k;
        json_t *f;
        json_array_foreach(json_object_get(params, "facts"), k, f) json_object_del(c->facts[scope], json_string_value(f));
    }
    json_decref(settled);
}

/* Sends calls [from, to) as one batch. */
static void send_batch(replay *r, size_t from, size_t to)
{
    if (r->lost || from >= to)
        return;
    json_t *calls = json_array();
    for (size_t i = from; i < to; i++)
        json_array_append(calls, json_array_get(r->calls, i));
    json_t *reply = NULL;
    json_t *params = json_pack("{s:o, s:b}", "calls", calls, "stop_on_error", 0);
    int rc = params ? cod_roundtrip(r->c, "batch", params, &reply) : COD_ENOMEM;
    if (rc == COD_ECONN || rc == COD_ETIMEOUT || rc == COD_EPROTO) {
        r->lost = 1;
        return;
    }
    json_t *results = json_object_get(json_object_get(reply, "result"), "results");
    for (size_t i = from; i < to; i++)
        apply(r, json_array_get(r->calls, i), json_array_get(r->what, i), json_array_get(results, i - from));
    json_decref(reply);
}

static void replay_facts(replay *r, int scope, int persistent)
{
    json_t *part = json_array();
    size_t bytes = 0;
    const char *text;
    json_t *v;
    json_object_foreach(r->c->facts[scope], text, v) {
        if (json_is_true(v) != persistent)
            continue;
        json_array_append_new(part, json_string(text));
        bytes += strlen(text) + 4;
        if (bytes > r->c->max_frame / 4) {
            add_call(r, "add_facts", json_pack("{s:o, s:s, s:b}", "facts", part, "scope", scope ? "system" : "app",
                                               "persistent", persistent), R_FACTS, NULL);
            part = json_array();
            bytes = 0;
        }
    }
    if (json_array_size(part))
        add_call(r, "add_facts", json_pack("{s:o, s:s, s:b}", "facts", part, "scope", scope ? "system" : "app",
                                           "persistent", persistent), R_FACTS, NULL);
    else
        json_decref(part);
}

int cod_state_replay(cod_conn *c)
{
    replay r = {.c = c, .calls = json_array(), .what = json_array()};
    if (!r.calls || !r.what) {
        json_decref(r.calls);
        json_decref(r.what);
        return 1;
    }
    size_t i;
    json_t *p;
    json_array_foreach(c->procs, i, p) {
        json_t *text = json_object_get(p, "text");
        add_call(&r, "add_procedure",
                 json_pack("{s:O, s:O}", "text", text, "persistent", json_object_get(p, "persistent")), R_PROC,
                 json_incref(text));
    }
    for (int scope = 0; scope < 2; scope++)
        for (int persistent = 0; persistent < 2; persistent++)
            replay_facts(&r, scope, persistent);
    for (cod_sub *s = c->subs; s; s = s->next) {
        if (s->kind != COD_SUB_EVENT)
            continue;
        s->server_id = -1;
        add_call(&r, "subscribe", json_pack("{s:s, s:O}", "event", s->event, "filter", s->filter), R_SUB,
                 json_integer(s->id));
    }
    const char *name;
    json_t *task;
    json_object_foreach(c->tasks, name, task)
        add_call(&r, "register_task", json_deep_copy(task), R_TASK, json_string(name));
    /* Batches of at most half a frame each (a single larger call goes alone). */
    size_t n = json_array_size(r.calls), from = 0, bytes = 0;
    for (i = 0; i < n; i++) {
        size_t size = (size_t)json_integer_value(json_array_get(json_array_get(r.what, i), 2));
        if (i > from && bytes + size > c->max_frame / 2) {
            send_batch(&r, from, i);
            from = i;
            bytes = 0;
        }
        bytes += size;
    }
    send_batch(&r, from, n);
    json_decref(r.calls);
    json_decref(r.what);
    return r.lost ? COD_ECONN : r.failures;
}

/* ---- a view of the held state ---- */

cod_reply *cod_held_state(cod_conn *c)
{
    if (!c)
        return NULL;
    pthread_mutex_lock(&c->io);
    json_t *facts[2] = {json_array(), json_array()};
    for (int scope = 0; scope < 2; scope++) {
        const char *text;
        json_t *v;
        json_object_foreach(c->facts[scope], text, v) json_array_append_new(facts[scope], json_string(text));
    }
    json_t *procs = json_array(), *subs = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(c->procs, i, p) json_array_append(procs, json_object_get(p, "text"));
    for (cod_sub *s = c->subs; s; s = s->next)
        if (s->kind == COD_SUB_EVENT)
            json_array_insert_new(subs, 0, json_pack("{s:i, s:s, s:O}", "id", s->id, "event", s->event, "filter", s->filter));
    json_t *root = json_pack("{s:{s:o, s:o, s:o, s:o, s:o}}", "result", "facts", facts[0], "system_facts", facts[1],
                             "procedures", procs, "subscriptions", subs, "tasks", json_deep_copy(c->tasks));
    pthread_mutex_unlock(&c->io);
    if (!root) {
        cod_set_error(c, COD_ENOMEM, 0, NULL, "cod_held_state: out of memory");
        return NULL;
    }
    return cod_reply_wrap(root);
}
