/* Values, replies and allocations: typed views of the JSON the daemon sends.
 *
 * A cod_value is a jansson value seen through a Prolog lens (docs/skb-schema.md):
 * {"functor", "args"} objects are compound terms, {"$bigint": digits} integers beyond
 * 64 bits, null an unbound variable.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define J(v) ((json_t *)(v))

static int is_compound(const json_t *j)
{
    return json_object_size(j) == 2 && json_is_string(json_object_get(j, "functor")) &&
           json_is_array(json_object_get(j, "args"));
}

static const char *bigint_digits(const json_t *j)
{
    if (json_object_size(j) != 1)
        return NULL;
    json_t *d = json_object_get(j, "$bigint");
    return json_is_string(d) ? json_string_value(d) : NULL;
}

cod_type cod_value_type(const cod_value *v)
{
    const json_t *j = (const json_t *)v;
    if (!j)
        return COD_NULL;
    switch (json_typeof(j)) {
    case JSON_TRUE:
    case JSON_FALSE: return COD_BOOL;
    case JSON_INTEGER: return COD_INT;
    case JSON_REAL: return COD_FLOAT;
    case JSON_STRING: return COD_STRING;
    case JSON_ARRAY: return COD_LIST;
    case JSON_OBJECT:
        if (is_compound(j))
            return COD_COMPOUND;
        return bigint_digits(j) ? COD_BIGINT : COD_OBJECT;
    default: return COD_NULL;
    }
}

int cod_value_int(const cod_value *v, long long *out)
{
    switch (cod_value_type(v)) {
    case COD_INT: *out = json_integer_value(J(v)); return 0;
    case COD_BIGINT: return COD_ERANGE;
    default: return COD_ETYPE;
    }
}

int cod_value_float(const cod_value *v, double *out)
{
    switch (cod_value_type(v)) {
    case COD_FLOAT: *out = json_real_value(J(v)); return 0;
    case COD_INT: *out = (double)json_integer_value(J(v)); return 0;
    case COD_BIGINT: *out = strtod(bigint_digits(J(v)), NULL); return 0;
    default: return COD_ETYPE;
    }
}

int cod_value_bool(const cod_value *v, int *out)
{
    if (cod_value_type(v) != COD_BOOL)
        return COD_ETYPE;
    *out = json_is_true(J(v));
    return 0;
}

const char *cod_value_string(const cod_value *v, size_t *len)
{
    if (!json_is_string(J(v)))
        return NULL;
    if (len)
        *len = json_string_length(J(v));
    return json_string_value(J(v));
}

const char *cod_value_bigint(const cod_value *v) { return v && json_is_object(J(v)) ? bigint_digits(J(v)) : NULL; }

size_t cod_value_length(const cod_value *v)
{
    switch (cod_value_type(v)) {
    case COD_LIST: return json_array_size(J(v));
    case COD_COMPOUND: return json_array_size(json_object_get(J(v), "args"));
    case COD_OBJECT: return json_object_size(J(v));
    default: return 0;
    }
}

const cod_value *cod_value_at(const cod_value *v, size_t i)
{
    switch (cod_value_type(v)) {
    case COD_LIST: return (const cod_value *)json_array_get(J(v), i);
    case COD_COMPOUND: return (const cod_value *)json_array_get(json_object_get(J(v), "args"), i);
    default: return NULL;
    }
}

const char *cod_value_functor(const cod_value *v)
{
    return cod_value_type(v) == COD_COMPOUND ? json_string_value(json_object_get(J(v), "functor")) : NULL;
}

const cod_value *cod_value_get(const cod_value *v, const char *key)
{
    if (!key || cod_value_type(v) != COD_OBJECT)
        return NULL;
    return (const cod_value *)json_object_get(J(v), key);
}

int cod_value_foreach(const cod_value *v, int (*fn)(const char *, const cod_value *, void *), void *userdata)
{
    if (!fn || cod_value_type(v) != COD_OBJECT)
        return COD_ETYPE;
    const char *key;
    json_t *val;
    json_object_foreach(J(v), key, val) {
        int rc = fn(key, (const cod_value *)val, userdata);
        if (rc)
            return rc;
    }
    return 0;
}

int cod_json_ints(const json_t *v, int **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return COD_ETYPE;
    size_t len = json_array_size(v);
    int *a = malloc((len ? len : 1) * sizeof *a);
    if (!a)
        return COD_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            free(a);
            return COD_ETYPE;
        }
        json_int_t x = json_integer_value(e);
        if (x < -2147483647 - 1 || x > 2147483647) {
            free(a);
            return COD_ERANGE;
        }
        a[i] = (int)x;
    }
    *out = a;
    *n = len;
    return 0;
}

int cod_value_int_list(const cod_value *v, int **out, size_t *n)
{
    if (!out || !n)
        return COD_EINVAL;
    if (cod_value_type(v) != COD_LIST) {
        *out = NULL;
        *n = 0;
        return COD_ETYPE;
    }
    return cod_json_ints(J(v), out, n);
}

char *cod_value_json(const cod_value *v)
{
    cod_buf b = {0};
    json_t *null = NULL;
    if (!v)
        null = json_null();
    if (cod_buf_dump_json(&b, v ? J(v) : null)) {
        cod_buf_free(&b);
        return NULL;
    }
    return cod_buf_take(&b);
}

/* ---- replies ---- */

cod_reply *cod_reply_wrap(json_t *root)
{
    cod_reply *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(root);
        return NULL;
    }
    r->root = root;
    r->result = json_object_get(root, "result");
    json_t *sols = json_object_get(r->result, "solutions");
    r->solutions = json_is_array(sols) ? sols : NULL;
    return r;
}

size_t cod_reply_count(const cod_reply *r) { return r ? json_array_size(r->solutions) : 0; }

const cod_value *cod_reply_solution(const cod_reply *r, size_t solution)
{
    if (!r)
        return NULL;
    json_t *s = json_array_get(r->solutions, solution);
    return json_is_object(s) ? (const cod_value *)s : NULL;
}

const cod_value *cod_reply_get(const cod_reply *r, size_t solution, const char *var)
{
    if (!r || !var)
        return NULL;
    return (const cod_value *)json_object_get(json_array_get(r->solutions, solution), var);
}

const cod_value *cod_reply_result(const cod_reply *r) { return r ? (const cod_value *)r->result : NULL; }

void cod_reply_free(cod_reply *r)
{
    if (!r)
        return;
    json_decref(r->root);
    free(r);
}

/* ---- batch outcomes ---- */

static json_t *batch_item(const cod_reply *r, size_t i)
{
    return r ? json_array_get(json_object_get(r->result, "results"), i) : NULL;
}

size_t cod_batch_count(const cod_reply *r)
{
    return r ? json_array_size(json_object_get(r->result, "results")) : 0;
}

const cod_value *cod_batch_result(const cod_reply *r, size_t i)
{
    json_t *item = batch_item(r, i);
    return item && !json_object_get(item, "error") ? (const cod_value *)json_object_get(item, "result") : NULL;
}

int cod_batch_error(const cod_reply *r, size_t i, long long *server_code, const char **message)
{
    json_t *item = batch_item(r, i);
    if (!item)
        return COD_EINVAL;
    json_t *err = json_object_get(item, "error");
    if (!err)
        return 0;
    long long code = json_integer_value(json_object_get(err, "code"));
    if (server_code)
        *server_code = code;
    if (message)
        *message = json_string_value(json_object_get(err, "message"));
    return cod_error_from_server(code);
}

/* ---- allocations ---- */

void cod_allocation_clear(cod_allocation *a)
{
    if (!a)
        return;
    free(a->task);
    free(a->app);
    free(a->cores);
    free(a->numa_nodes);
    free(a->memory_nodes);
    free(a->releasing);
    free(a->added);
    free(a->removed);
    free(a->reason);
    memset(a, 0, sizeof *a);
    a->deadline_s = -1;
}

static char *dup_str(const json_t *v)
{
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

int cod_allocation_from_json(const json_t *v, cod_allocation *out)
{
    cod_allocation a;
    memset(&a, 0, sizeof a);
    a.deadline_s = -1;
    if (!json_is_object(v) || !json_is_integer(json_object_get(v, "epoch")))
        return COD_EPROTO;
    a.epoch = json_integer_value(json_object_get(v, "epoch"));
    int rc = 0;
    if ((json_object_get(v, "task") && !(a.task = dup_str(json_object_get(v, "task")))) ||
        (json_is_string(json_object_get(v, "app")) && !(a.app = dup_str(json_object_get(v, "app")))) ||
        (json_is_string(json_object_get(v, "reason")) && !(a.reason = dup_str(json_object_get(v, "reason")))))
        rc = COD_ENOMEM;
    if (!rc)
        rc = cod_json_ints(json_object_get(v, "cores"), &a.cores, &a.ncores);
    if (!rc)
        rc = cod_json_ints(json_object_get(v, "numa_nodes"), &a.numa_nodes, &a.nnuma_nodes);
    if (!rc)
        rc = cod_json_ints(json_object_get(v, "memory_nodes"), &a.memory_nodes, &a.nmemory_nodes);
    if (!rc)
        rc = cod_json_ints(json_object_get(v, "releasing"), &a.releasing, &a.nreleasing);
    if (!rc)
        rc = cod_json_ints(json_object_get(v, "added"), &a.added, &a.nadded);
    if (!rc)
        rc = cod_json_ints(json_object_get(v, "removed"), &a.removed, &a.nremoved);
    json_t *dl = json_object_get(v, "deadline_s");
    if (json_is_number(dl))
        a.deadline_s = json_number_value(dl);
    if (rc) {
        cod_allocation_clear(&a);
        return rc == COD_ENOMEM ? rc : COD_EPROTO;
    }
    cod_allocation_clear(out);
    *out = a;
    return 0;
}

/* ---- events ---- */

const char *cod_event_name(const cod_event *ev) { return ev ? ev->name : NULL; }
int cod_event_subscription(const cod_event *ev) { return ev ? ev->subscription : 0; }
const cod_value *cod_event_params(const cod_event *ev) { return ev ? (const cod_value *)ev->params : NULL; }

const cod_value *cod_event_get(const cod_event *ev, const char *key)
{
    return ev && key ? (const cod_value *)json_object_get(ev->params, key) : NULL;
}

int cod_event_allocation(const cod_event *ev, cod_allocation *out)
{
    if (!ev || !out)
        return COD_EINVAL;
    if (strcmp(ev->name, "allocation_changed") != 0)
        return COD_ETYPE;
    return cod_allocation_from_json(ev->params, out);
}
