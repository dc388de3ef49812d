/* The typed calls of cod.h: each builds its params, makes one round trip under the
 * connection's lock, and notes what the application now holds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CHECK_CONN(c, ret)       \
    do {                         \
        if (!(c)) {              \
            errno = EINVAL;      \
            return ret;          \
        }                        \
    } while (0)

/* A JSON string of UTF-8 text; NULL if text is NULL or not UTF-8. */
static json_t *jstr(const char *s) { return s ? json_string(s) : NULL; }

static int bad_arg(cod_conn *c, const char *method, const char *what)
{
    return cod_set_error(c, COD_EINVAL, 0, NULL, "%s: %s", method, what);
}

static int oom(cod_conn *c, const char *method) { return cod_set_error(c, COD_ENOMEM, 0, NULL, "%s: out of memory", method); }

/* One call under the lock; on success the held state notes it.  A write whose reply is lost
 * after it left is COD_EUNKNOWN, and kept for cod_retry when it carries a request_key.  Takes params. */
static int call(cod_conn *c, const char *method, json_t *params, json_t **reply)
{
    json_t *keep = json_incref(params);
    pthread_mutex_lock(&c->io);
    int rc;
    if (cod_is_write_method(method)) {
        cod_buf b = {0};
        rc = cod_buf_dump_json(&b, params) ? oom(c, method) : cod_keyed_call(c, method, b.p, b.len, reply);
        cod_buf_free(&b);
        json_decref(params);
    } else {
        rc = cod_roundtrip(c, method, params, reply);
    }
    if (rc == 0)
        cod_state_note(c, method, keep, json_object_get(*reply, "result"));
    pthread_mutex_unlock(&c->io);
    json_decref(keep);
    return rc;
}

/* A write with a fresh request key (outcomes.c) under the lock; on success the held state notes
 * it.  Takes params. */
static int write_call(cod_conn *c, const char *method, json_t *params, json_t **reply)
{
    cod_buf b = {0};
    int rc = cod_buf_dump_json(&b, params) ? oom(c, method) : 0;
    if (rc == 0) {
        pthread_mutex_lock(&c->io);
        rc = cod_keyed_write(c, method, b.p, b.len, reply);
        if (rc == 0)
            cod_state_note(c, method, params, json_object_get(*reply, "result"));
        pthread_mutex_unlock(&c->io);
    }
    cod_buf_free(&b);
    json_decref(params);
    return rc;
}

int cod_is_write_method(const char *method)
{
    static const char *const writes[] = {"register_task", "update_task", "deregister_task", "deploy_plan",
                                         "add_facts", "remove_facts", "add_procedure", "subscribe",
                                         "unsubscribe", "register_unmanaged", "deregister_unmanaged", NULL};
    for (size_t i = 0; writes[i]; i++)
        if (strcmp(method, writes[i]) == 0)
            return 1;
    return 0;
}

static int call_void(cod_conn *c, const char *method, json_t *params)
{
    json_t *reply = NULL;
    int rc = call(c, method, params, &reply);
    json_decref(reply);
    return rc;
}

/* ---- facts and procedures ---- */

int cod_add_facts_flags(cod_conn *c, const char *const *facts, size_t n, int flags)
{
    CHECK_CONN(c, COD_EINVAL);
    if (!facts && n)
        return bad_arg(c, "add_facts", "no fact array given");
    /* The params are written as JSON text directly: a batch of 10,000 facts is the case
     * that counts, and it needs no tree of values. */
    cod_buf p = {0};
    int rc = cod_buf_puts(&p, "{\"facts\":[");
    for (size_t i = 0; i < n && !rc; i++) {
        if (!facts[i]) {
            cod_buf_free(&p);
            return cod_set_error(c, COD_EINVAL, 0, NULL, "add_facts: fact %zu is NULL", i);
        }
        if (i)
            rc = cod_buf_putc(&p, ',');
        if (!rc)
            rc = cod_buf_json_string(&p, facts[i], strlen(facts[i]));
        if (rc == COD_EINVAL) {
            cod_buf_free(&p);
            return cod_set_error(c, COD_EINVAL, 0, NULL, "add_facts: fact %zu is not valid UTF-8", i);
        }
    }
    if (!rc)
        rc = cod_buf_puts(&p, (flags & COD_SYSTEM) ? "],\"scope\":\"system\"" : "]");
    if (!rc && (flags & COD_PERSISTENT))
        rc = cod_buf_puts(&p, ",\"persistent\":true");
    if (!rc)
        rc = cod_buf_putc(&p, '}');
    if (rc) {
        cod_buf_free(&p);
        return oom(c, "add_facts");
    }
    json_t *reply = NULL;
    pthread_mutex_lock(&c->io);
    rc = cod_keyed_write(c, "add_facts", p.p, p.len, &reply);
    if (rc == 0)
        cod_state_hold_facts(c, (flags & COD_SYSTEM) != 0, facts, n, (flags & COD_PERSISTENT) != 0);
    pthread_mutex_unlock(&c->io);
    json_decref(reply);
    cod_buf_free(&p);
    return rc;
}

int cod_add_facts(cod_conn *c, const char *const *facts, size_t n) { return cod_add_facts_flags(c, facts, n, 0); }

/* Expands a template for method; NULL with the error recorded. */
static char *expand(cod_conn *c, const char *method, const char *fmt, va_list ap)
{
    cod_buf b = {0};
    char *why = NULL;
    int rc = cod_vformat_to(&b, fmt, ap, &why);
    if (rc) {
        cod_buf_free(&b);
        if (rc == COD_ENOMEM)
            oom(c, method);
        else
            cod_set_error(c, COD_EINVAL, 0, NULL, "%s: %s", method, why ? why : "bad template");
        free(why);
        return NULL;
    }
    return cod_buf_take(&b);
}

int cod_vadd_fact(cod_conn *c, const char *fmt, va_list ap)
{
    CHECK_CONN(c, COD_EINVAL);
    char *text = expand(c, "add_facts", fmt, ap);
    if (!text)
        return cod_errcode(c);
    const char *one[] = {text};
    int rc = cod_add_facts_flags(c, one, 1, 0);
    free(text);
    return rc;
}

int cod_add_fact(cod_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = cod_vadd_fact(c, fmt, ap);
    va_end(ap);
    return rc;
}

int cod_remove_facts_flags(cod_conn *c, int flags, const char *pattern)
{
    CHECK_CONN(c, COD_EINVAL);
    json_t *p = jstr(pattern);
    if (!p)
        return bad_arg(c, "remove_facts", pattern ? "the pattern is not valid UTF-8" : "no pattern given");
    json_t *params = json_pack("{s:[o]}", "patterns", p);
    if (!params)
        return oom(c, "remove_facts");
    if (flags & COD_SYSTEM)
        json_object_set_new(params, "scope", json_string("system"));
    json_t *reply = NULL;
    int rc = write_call(c, "remove_facts", params, &reply);
    if (rc == 0) {
        json_int_t n = json_integer_value(json_object_get(json_object_get(reply, "result"), "removed"));
        rc = n > 2147483647 ? 2147483647 : (int)n;
    }
    json_decref(reply);
    return rc;
}

int cod_remove_facts(cod_conn *c, const char *fmt, ...)
{
    CHECK_CONN(c, COD_EINVAL);
    va_list ap;
    va_start(ap, fmt);
    char *text = expand(c, "remove_facts", fmt, ap);
    va_end(ap);
    if (!text)
        return cod_errcode(c);
    int rc = cod_remove_facts_flags(c, 0, text);
    free(text);
    return rc;
}

int cod_add_procedure_flags(cod_conn *c, const char *text, int flags)
{
    CHECK_CONN(c, COD_EINVAL);
    json_t *t = jstr(text);
    if (!t)
        return bad_arg(c, "add_procedure", text ? "the text is not valid UTF-8" : "no text given");
    json_t *params = json_pack("{s:o}", "text", t);
    if (!params)
        return oom(c, "add_procedure");
    if (flags & COD_PERSISTENT)
        json_object_set_new(params, "persistent", json_true());
    json_t *reply = NULL;
    int rc = write_call(c, "add_procedure", params, &reply);
    json_decref(reply);
    return rc;
}

int cod_add_procedure(cod_conn *c, const char *text) { return cod_add_procedure_flags(c, text, 0); }

/* ---- queries ---- */

/* The params of execute_query are written as JSON text directly: this is the hot path. */
cod_reply *cod_query_goal(cod_conn *c, const char *goal, const cod_query_opts *opts)
{
    CHECK_CONN(c, NULL);
    if (!goal) {
        bad_arg(c, "execute_query", "no goal given");
        return NULL;
    }
    cod_buf p = {0};
    int rc = cod_buf_puts(&p, "{\"goal\":");
    if (!rc)
        rc = cod_buf_json_string(&p, goal, strlen(goal));
    if (rc == COD_EINVAL) {
        cod_buf_free(&p);
        bad_arg(c, "execute_query", "the goal is not valid UTF-8");
        return NULL;
    }
    if (!rc && opts && opts->first_only)
        rc = cod_buf_puts(&p, ",\"all_solutions\":false");
    if (!rc && opts && opts->max_solutions > 0)
        rc = cod_buf_printf(&p, ",\"max_solutions\":%d", opts->max_solutions);
    if (!rc && opts && opts->timeout_s > 0)
        rc = cod_buf_printf(&p, ",\"timeout_s\":%.17g", opts->timeout_s);
    if (!rc)
        rc = cod_buf_putc(&p, '}');
    if (rc) {
        cod_buf_free(&p);
        oom(c, "execute_query");
        return NULL;
    }
    json_t *reply = NULL;
    pthread_mutex_lock(&c->io);
    rc = cod_roundtrip_query_text(c, p.p, p.len, &reply);
    pthread_mutex_unlock(&c->io);
    cod_buf_free(&p);
    if (rc)
        return NULL;
    if (!json_is_array(json_object_get(json_object_get(reply, "result"), "solutions"))) {
        json_decref(reply);
        cod_set_error(c, COD_EPROTO, 0, NULL, "execute_query: the daemon's answer has no list of solutions");
        return NULL;
    }
    cod_reply *r = cod_reply_wrap(reply);
    if (!r)
        oom(c, "execute_query");
    return r;
}

cod_reply *cod_vquery(cod_conn *c, const char *fmt, va_list ap)
{
    CHECK_CONN(c, NULL);
    char *goal = expand(c, "execute_query", fmt, ap);
    if (!goal)
        return NULL;
    cod_reply *r = cod_query_goal(c, goal, NULL);
    free(goal);
    return r;
}

cod_reply *cod_query(cod_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cod_reply *r = cod_vquery(c, fmt, ap);
    va_end(ap);
    return r;
}

cod_reply *cod_call(cod_conn *c, const char *method, const char *params_json)
{
    CHECK_CONN(c, NULL);
    if (!method) {
        bad_arg(c, "cod_call", "no method given");
        return NULL;
    }
    if (strcmp(method, "hello") == 0) {
        bad_arg(c, "hello", "cod_connect and cod_reconnect say hello; cod_server_info gives its result");
        return NULL;
    }
    json_t *params = NULL;
    if (params_json) {
        char *why = NULL;
        params = cod_json_parse(params_json, strlen(params_json), &why);
        if (!params || !json_is_object(params)) {
            cod_set_error(c, COD_EINVAL, 0, NULL, "%s: params must be a JSON object%s%s", method, why ? ": " : "",
                          why ? why : "");
            free(why);
            json_decref(params);
            return NULL;
        }
    }
    json_t *reply = NULL;
    int rc;
    if (strcmp(method, "execute_query") == 0) {
        pthread_mutex_lock(&c->io);
        rc = cod_roundtrip_query(c, params ? params : json_object(), &reply);
        pthread_mutex_unlock(&c->io);
    } else {
        rc = call(c, method, params ? params : json_object(), &reply);
    }
    if (rc)
        return NULL;
    cod_reply *r = cod_reply_wrap(reply);
    if (!r)
        oom(c, method);
    return r;
}

/* ---- tasks ---- */

struct cod_task {
    char *name;
    json_t *props;
    json_t *facts;
    json_t *procs;
    int persistent;
    int has_pid;
    long long pid;
};

cod_task *cod_task_new(const char *name)
{
    cod_task *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->props = json_object();
    t->facts = json_array();
    t->procs = json_array();
    if ((name && !(t->name = strdup(name))) || !t->props || !t->facts || !t->procs) {
        cod_task_free(t);
        errno = ENOMEM;
        return NULL;
    }
    return t;
}

void cod_task_free(cod_task *t)
{
    if (!t)
        return;
    free(t->name);
    json_decref(t->props);
    json_decref(t->facts);
    json_decref(t->procs);
    free(t);
}

int cod_task_set_pid(cod_task *t, pid_t pid)
{
    if (!t || pid <= 0)
        return COD_EINVAL;
    t->has_pid = 1;
    t->pid = pid;
    return 0;
}

static int set_prop(cod_task *t, const char *property, json_t *v)
{
    if (!t || !property || !v || !cod_utf8_valid(property, strlen(property))) {
        json_decref(v);
        return COD_EINVAL;
    }
    return json_object_set_new(t->props, property, v) ? COD_ENOMEM : 0;
}

int cod_task_set_int(cod_task *t, const char *property, long long value)
{
    return set_prop(t, property, json_integer(value));
}

int cod_task_set_bool(cod_task *t, const char *property, int value)
{
    return set_prop(t, property, json_boolean(value));
}

int cod_task_set_string(cod_task *t, const char *property, const char *value)
{
    return set_prop(t, property, jstr(value));
}

int cod_task_add_string(cod_task *t, const char *property, const char *value)
{
    if (!t || !property)
        return COD_EINVAL;
    json_t *v = jstr(value);
    if (!v)
        return COD_EINVAL;
    json_t *list = json_object_get(t->props, property);
    if (!json_is_array(list)) {
        list = json_array();
        if (!list || set_prop(t, property, list)) {
            json_decref(v);
            return COD_ENOMEM;
        }
    }
    return json_array_append_new(list, v) ? COD_ENOMEM : 0;
}

int cod_task_set_derived(cod_task *t, const char *property, const char *query, const char *var)
{
    json_t *q = jstr(query), *v = jstr(var);
    if (!q || !v) {
        json_decref(q);
        json_decref(v);
        return COD_EINVAL;
    }
    return set_prop(t, property, json_pack("{s:o, s:o}", "query", q, "var", v));
}

int cod_task_add_fact(cod_task *t, const char *fact)
{
    json_t *f = jstr(fact);
    if (!t || !f) {
        json_decref(f);
        return COD_EINVAL;
    }
    return json_array_append_new(t->facts, f) ? COD_ENOMEM : 0;
}

int cod_task_add_procedure(cod_task *t, const char *text)
{
    json_t *p = jstr(text);
    if (!t || !p) {
        json_decref(p);
        return COD_EINVAL;
    }
    return json_array_append_new(t->procs, p) ? COD_ENOMEM : 0;
}

int cod_task_set_persistent(cod_task *t, int persistent)
{
    if (!t)
        return COD_EINVAL;
    t->persistent = persistent != 0;
    return 0;
}

static int allocation_out(cod_conn *c, const char *method, const json_t *alloc, cod_allocation *out)
{
    if (!out)
        return 0;
    int rc = cod_allocation_from_json(alloc, out);
    if (rc)
        return cod_set_error(c, rc, 0, NULL, "%s: the daemon's answer holds no allocation", method);
    return 0;
}

int cod_register_task(cod_conn *c, const cod_task *t, cod_event_fn on_allocation, void *userdata, cod_allocation *out)
{
    CHECK_CONN(c, COD_EINVAL);
    if (!t || !t->name)
        return bad_arg(c, "register_task", "a task with a name is required");
    json_t *name = jstr(t->name);
    if (!name)
        return bad_arg(c, "register_task", "the task name is not valid UTF-8");
    json_t *params = json_pack("{s:o, s:O}", "name", name, "properties", t->props);
    if (!params)
        return oom(c, "register_task");
    if (t->has_pid)
        json_object_set_new(params, "pid", json_integer(t->pid));
    if (json_array_size(t->facts))
        json_object_set(params, "facts", t->facts);
    if (json_array_size(t->procs))
        json_object_set(params, "procedures", t->procs);
    if (t->persistent)
        json_object_set_new(params, "persistent", json_true());
    pthread_mutex_lock(&c->io);
    /* The handler is in place before the call: the first upcall comes before the reply. */
    cod_sub *s = cod_sub_find_task(c, t->name);
    int created = 0;
    if (!s && (s = calloc(1, sizeof *s)) != NULL) {
        s->kind = COD_SUB_TASK;
        s->server_id = -1;
        s->task = strdup(t->name);
        created = 1;
    }
    if (!s || !s->task) {
        if (s && created)
            free(s);
        pthread_mutex_unlock(&c->io);
        json_decref(params);
        return oom(c, "register_task");
    }
    cod_event_fn old_fn = s->fn;
    void *old_ud = s->ud;
    pthread_mutex_lock(&c->mu);
    s->fn = on_allocation;
    s->ud = userdata;
    if (created) {
        s->next = c->subs;
        c->subs = s;
    }
    pthread_mutex_unlock(&c->mu);
    json_t *keep = json_incref(params);
    json_t *reply = NULL;
    int rc = cod_roundtrip(c, "register_task", params, &reply);
    json_t *result = json_object_get(reply, "result");
    if (rc == 0) {
        cod_state_note(c, "register_task", keep, result);
    } else if (!created) {
        pthread_mutex_lock(&c->mu); /* the task of that name keeps its handler */
        s->fn = old_fn;
        s->ud = old_ud;
        pthread_mutex_unlock(&c->mu);
    } else {
        pthread_mutex_lock(&c->mu);
        for (cod_sub **p = &c->subs; *p; p = &(*p)->next)
            if (*p == s) {
                *p = s->next;
                break;
            }
        pthread_mutex_unlock(&c->mu);
        free(s->task);
        free(s);
    }
    pthread_mutex_unlock(&c->io);
    json_decref(keep);
    if (rc == 0)
        rc = allocation_out(c, "register_task", json_object_get(result, "allocation"), out);
    json_decref(reply);
    return rc;
}

int cod_update_task(cod_conn *c, const cod_task *changes, cod_allocation *out)
{
    CHECK_CONN(c, COD_EINVAL);
    if (!changes)
        return bad_arg(c, "update_task", "no changes given");
    json_t *params = json_pack("{s:O}", "properties", changes->props);
    if (!params)
        return oom(c, "update_task");
    if (changes->name)
        json_object_set_new(params, "task", json_string(changes->name));
    json_t *reply = NULL;
    int rc = call(c, "update_task", params, &reply);
    if (rc == 0)
        rc = allocation_out(c, "update_task", json_object_get(json_object_get(reply, "result"), "allocation"), out);
    json_decref(reply);
    return rc;
}

static json_t *task_params(const char *task)
{
    json_t *p = json_object();
    if (p && task)
        json_object_set_new(p, "task", json_string(task));
    return p;
}

int cod_deregister_task(cod_conn *c, const char *task)
{
    CHECK_CONN(c, COD_EINVAL);
    json_t *params = task_params(task);
    return params ? call_void(c, "deregister_task", params) : oom(c, "deregister_task");
}

static int allocation_call(cod_conn *c, const char *method, const char *task, cod_allocation *out)
{
    CHECK_CONN(c, COD_EINVAL);
    json_t *params = task_params(task);
    if (!params)
        return oom(c, method);
    json_t *reply = NULL;
    int rc = call(c, method, params, &reply);
    json_t *result = json_object_get(reply, "result");
    if (rc == 0 && json_object_get(result, "tasks") && !json_object_get(result, "task"))
        rc = cod_set_error(c, COD_ENOENT, 0, NULL,
                           "%s: this connection has no task; name one (cod_call(c, \"get_allocation\", NULL) "
                           "gives the whole plan)",
                           method);
    if (rc == 0)
        rc = allocation_out(c, method, result, out);
    json_decref(reply);
    return rc;
}

int cod_get_allocation(cod_conn *c, const char *task, cod_allocation *out)
{
    return allocation_call(c, "get_allocation", task, out);
}

int cod_request_allocation(cod_conn *c, const char *task, cod_allocation *out)
{
    return allocation_call(c, "request_allocation", task, out);
}

int cod_ack_allocation(cod_conn *c, const char *task, long long epoch)
{
    CHECK_CONN(c, COD_EINVAL);
    json_t *params = task_params(task);
    if (!params)
        return oom(c, "ack_allocation");
    json_object_set_new(params, "epoch", json_integer(epoch));
    return call_void(c, "ack_allocation", params);
}

int cod_last_allocation(cod_conn *c, const char *task, cod_allocation *out)
{
    CHECK_CONN(c, COD_EINVAL);
    if (!out)
        return bad_arg(c, "cod_last_allocation", "no output given");
    pthread_mutex_lock(&c->mu);
    json_t *a = NULL;
    if (task)
        a = json_object_get(c->allocs, task);
    else if (json_object_size(c->allocs) == 1)
        a = json_object_iter_value(json_object_iter(c->allocs));
    a = a ? json_deep_copy(a) : NULL;
    pthread_mutex_unlock(&c->mu);
    if (!a)
        return cod_set_error(c, COD_ENOENT, 0, NULL, "no allocation of %s heard yet", task ? task : "a single task");
    int rc = cod_allocation_from_json(a, out);
    json_decref(a);
    return rc ? cod_set_error(c, rc, 0, NULL, "the allocation heard for %s is malformed", task ? task : "the task")
              : 0;
}

/* ---- subscriptions ---- */

int cod_subscribe(cod_conn *c, const char *event, const char *const *filter, cod_event_fn fn, void *userdata)
{
    CHECK_CONN(c, COD_EINVAL);
    json_t *ev = jstr(event);
    if (!ev)
        return bad_arg(c, "subscribe", event ? "the event name is not valid UTF-8" : "no event given");
    json_t *f = json_object();
    for (size_t i = 0; f && filter && filter[i]; i += 2) {
        json_t *v = jstr(filter[i + 1]);
        if (!v || !cod_utf8_valid(filter[i], strlen(filter[i]))) {
            json_decref(v);
            json_decref(f);
            json_decref(ev);
            return cod_set_error(c, COD_EINVAL, 0, NULL, "subscribe: filter key %s has %s", filter[i],
                                 filter[i + 1] ? "a value that is not valid UTF-8" : "no value (pairs end with NULL)");
        }
        json_t *old = json_object_get(f, filter[i]);
        if (!old) {
            json_object_set_new(f, filter[i], v);
        } else if (json_is_array(old)) {
            json_array_append_new(old, v);
        } else {
            json_t *list = json_pack("[O, o]", old, v);
            json_object_set_new(f, filter[i], list);
        }
    }
    cod_sub *s = calloc(1, sizeof *s);
    json_t *params = f ? json_pack("{s:o, s:O}", "event", ev, "filter", f) : NULL;
    if (!s || !params || !(s->event = strdup(event))) {
        if (s)
            free(s->event);
        free(s);
        json_decref(f);
        json_decref(params);
        return oom(c, "subscribe");
    }
    s->kind = COD_SUB_EVENT;
    s->filter = f;
    s->fn = fn;
    s->ud = userdata;
    json_t *reply = NULL;
    pthread_mutex_lock(&c->io);
    int rc = cod_roundtrip(c, "subscribe", params, &reply);
    if (rc == 0) {
        s->server_id = json_integer_value(json_object_get(json_object_get(reply, "result"), "subscription"));
        pthread_mutex_lock(&c->mu);
        s->id = rc = c->next_sub++;
        s->next = c->subs;
        c->subs = s;
        pthread_mutex_unlock(&c->mu);
        s = NULL;
    }
    pthread_mutex_unlock(&c->io);
    if (s) {
        free(s->event);
        json_decref(s->filter);
        free(s);
    }
    json_decref(reply);
    return rc;
}

int cod_unsubscribe(cod_conn *c, int subscription)
{
    CHECK_CONN(c, COD_EINVAL);
    pthread_mutex_lock(&c->io);
    cod_sub *s = NULL;
    for (cod_sub *p = c->subs; p; p = p->next)
        if (p->kind == COD_SUB_EVENT && p->id == subscription)
            s = p;
    int rc = 0;
    if (!s) {
        rc = cod_set_error(c, COD_ENOENT, 0, NULL, "unsubscribe: no subscription %d on this connection", subscription);
    } else {
        if (s->server_id >= 0 && !c->lost) {
            json_t *reply = NULL;
            rc = cod_roundtrip(c, "unsubscribe", json_pack("{s:I}", "subscription", (json_int_t)s->server_id), &reply);
            json_decref(reply);
            if (rc == COD_ECONN)
                rc = 0; /* gone with the connection anyway */
        }
        if (rc == 0 || rc == COD_ENOENT) {
            rc = 0;
            pthread_mutex_lock(&c->mu);
            for (cod_sub **p = &c->subs; *p; p = &(*p)->next)
                if (*p == s) {
                    *p = s->next;
                    break;
                }
            pthread_mutex_unlock(&c->mu);
            free(s->event);
            json_decref(s->filter);
            free(s);
        }
    }
    pthread_mutex_unlock(&c->io);
    return rc;
}

/* ---- batch ---- */

struct cod_batch {
    json_t *calls;
};

cod_batch *cod_batch_new(void)
{
    cod_batch *b = calloc(1, sizeof *b);
    if (b && !(b->calls = json_array())) {
        free(b);
        b = NULL;
    }
    return b;
}

void cod_batch_free(cod_batch *b)
{
    if (!b)
        return;
    json_decref(b->calls);
    free(b);
}

static int batch_append(cod_batch *b, const char *method, json_t *params)
{
    if (!b || !method || !params) {
        json_decref(params);
        return COD_EINVAL;
    }
    json_t *call = json_pack("{s:s, s:o}", "method", method, "params", params);
    return call && !json_array_append_new(b->calls, call) ? 0 : COD_ENOMEM;
}

int cod_batch_add(cod_batch *b, const char *method, const char *params_json)
{
    json_t *params = params_json ? cod_json_parse(params_json, strlen(params_json), NULL) : json_object();
    if (params && !json_is_object(params)) {
        json_decref(params);
        return COD_EINVAL;
    }
    return batch_append(b, method, params);
}

int cod_batch_add_facts(cod_batch *b, const char *const *facts, size_t n, int flags)
{
    if (!facts && n)
        return COD_EINVAL;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *f = jstr(facts[i]);
        if (!f) {
            json_decref(arr);
            return COD_EINVAL;
        }
        json_array_append_new(arr, f);
    }
    json_t *params = arr ? json_pack("{s:o}", "facts", arr) : NULL;
    if (params && (flags & COD_SYSTEM))
        json_object_set_new(params, "scope", json_string("system"));
    if (params && (flags & COD_PERSISTENT))
        json_object_set_new(params, "persistent", json_true());
    return batch_append(b, "add_facts", params);
}

int cod_batch_add_procedure(cod_batch *b, const char *text, int flags)
{
    json_t *t = jstr(text);
    json_t *params = t ? json_pack("{s:o}", "text", t) : NULL;
    if (params && (flags & COD_PERSISTENT))
        json_object_set_new(params, "persistent", json_true());
    return batch_append(b, "add_procedure", params);
}

int cod_batch_query(cod_batch *b, const char *fmt, ...)
{
    cod_buf g = {0};
    va_list ap;
    va_start(ap, fmt);
    int rc = cod_vformat_to(&g, fmt, ap, NULL);
    va_end(ap);
    if (rc) {
        cod_buf_free(&g);
        return rc;
    }
    json_t *goal = json_stringn(g.p ? g.p : "", g.len);
    cod_buf_free(&g);
    return batch_append(b, "execute_query", goal ? json_pack("{s:o}", "goal", goal) : NULL);
}

cod_reply *cod_batch_run(cod_conn *c, const cod_batch *b, int stop_on_error)
{
    CHECK_CONN(c, NULL);
    if (!b) {
        bad_arg(c, "batch", "no batch given");
        return NULL;
    }
    json_t *params = json_pack("{s:O, s:b}", "calls", b->calls, "stop_on_error", stop_on_error != 0);
    if (!params) {
        oom(c, "batch");
        return NULL;
    }
    json_t *reply = NULL;
    if (call(c, "batch", params, &reply))
        return NULL;
    cod_reply *r = cod_reply_wrap(reply);
    if (!r)
        oom(c, "batch");
    return r;
}
