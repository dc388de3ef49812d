/* libFuzzer target: the reply parser and everything that reads what it produces.
 *
 * The input is a byte stream from the daemon, fed to the reader in two pieces (split where
 * the first byte says); every message is classified, query answers and upcalls are walked
 * through the public accessors, allocations and batch outcomes are decoded.  The input is
 * also parsed as one JSON text, and its two halves are matched as a remove_facts pattern
 * and a fact.  No I/O.
 *
 *   make -C clients/c fuzz && clients/c/build/fuzz_reader -runs=1000000 CORPUS_DIR
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "reader.h"

static size_t sink;

static int visit_member(const char *key, const cod_value *v, void *ud);

static void walk(const cod_value *v, int depth)
{
    long long i;
    double d;
    int b;
    size_t len;
    if (depth > 4000)
        return;
    switch (cod_value_type(v)) {
    case COD_INT: sink += cod_value_int(v, &i) == 0 ? (size_t)i : 0; break;
    case COD_BIGINT:
        sink += strlen(cod_value_bigint(v));
        cod_value_float(v, &d);
        break;
    case COD_FLOAT: cod_value_float(v, &d); break;
    case COD_BOOL: cod_value_bool(v, &b); break;
    case COD_STRING: cod_value_string(v, &len); sink += len; break;
    case COD_LIST:
    case COD_COMPOUND: {
        if (cod_value_functor(v))
            sink += strlen(cod_value_functor(v));
        size_t n = cod_value_length(v);
        for (size_t k = 0; k <= n; k++) /* one past the end on purpose */
            walk(cod_value_at(v, k), depth + 1);
        int *ints;
        if (cod_value_int_list(v, &ints, &len) == 0)
            free(ints);
        break;
    }
    case COD_OBJECT: cod_value_foreach(v, visit_member, &depth); break;
    case COD_NULL: break;
    }
}

static int visit_member(const char *key, const cod_value *v, void *ud)
{
    sink += strlen(key);
    walk(v, *(int *)ud + 1);
    return 0;
}

static void use_message(cod_msg *m)
{
    if (m->kind == COD_MSG_REPLY && m->result) {
        json_t *root = json_incref(m->root);
        cod_reply *r = cod_reply_wrap(root);
        for (size_t s = 0; s <= cod_reply_count(r); s++) {
            walk(cod_reply_solution(r, s), 0);
            walk(cod_reply_get(r, s, "X"), 0);
        }
        walk(cod_reply_result(r), 0);
        for (size_t k = 0; k <= cod_batch_count(r); k++) {
            long long code;
            const char *msg;
            cod_batch_error(r, k, &code, &msg);
            walk(cod_batch_result(r, k), 0);
        }
        cod_allocation a = {0};
        if (cod_allocation_from_json(m->result, &a) == 0)
            cod_allocation_clear(&a);
        cod_reply_free(r);
    } else if (m->kind == COD_MSG_REPLY && m->error) {
        sink += (size_t)cod_error_from_server(json_integer_value(json_object_get(m->error, "code")));
    } else if (m->kind == COD_MSG_UPCALL) {
        struct cod_event ev = {m->method, 0, m->params};
        walk(cod_event_params(&ev), 0);
        walk(cod_event_get(&ev, "task"), 0);
        cod_allocation a = {0};
        if (cod_event_allocation(&ev, &a) == 0)
            cod_allocation_clear(&a);
    }
}

static void drain(cod_reader *r)
{
    cod_msg m;
    int rc;
    while ((rc = cod_reader_next(r, &m)) != 0) {
        use_message(&m);
        cod_msg_release(&m);
        if (rc < 0)
            break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cod_reader r;
    cod_reader_init(&r, 1 << 16);
    size_t split = size ? data[0] % (size + 1) : 0;
    cod_reader_feed(&r, data, split);
    drain(&r);
    cod_reader_feed(&r, data + split, size - split);
    drain(&r);
    cod_reader_release(&r);

    json_t *v = cod_json_parse((const char *)data, size, NULL);
    walk((const cod_value *)v, 0);
    json_decref(v);

    char *a = strndup((const char *)data, size / 2);
    char *b = strndup((const char *)data + size / 2, size - size / 2);
    if (a && b)
        sink += (size_t)cod_pattern_match(a, b);
    free(a);
    free(b);
    return 0;
}
