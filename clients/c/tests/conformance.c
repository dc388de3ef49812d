/* The shared conformance table (tests/data/conformance/cases.json) run through libcod.
 *
 *   conformance SOCKET CASES.json
 *
 * Each case runs on a fresh connection of its own application: its setup calls, then its
 * call through cod_call; the outcome is matched with the rules in the file's $comment (the
 * Python side, tests/helpers/conformance.py, applies the same).  Last line: N passed, N failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cod.h"
#include "internal.h"
#include "reader.h"

/* "path: expected <a>, got <b>" (or "path: missing (expected <a>)"). */
static char *why(const char *path, const char *expected_text, const json_t *a, const char *got_text, const json_t *b)
{
    char *ja = a ? json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *jb = b ? json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    cod_buf out = {0};
    cod_buf_printf(&out, "%s: %s%s%s%s", *path ? path : "value", expected_text, ja ? ja : "null", got_text,
                   got_text[0] ? (jb ? jb : "null") : "");
    free(ja);
    free(jb);
    return cod_buf_take(&out);
}

static int is_bigint(const json_t *v) { return json_is_object(v) && json_object_get(v, "$bigint") && json_object_size(v) == 1; }

/* Why got does not match expected, or NULL. */
static char *mismatch(const json_t *expected, const json_t *got, const char *path)
{
    if (json_is_string(expected)) {
        const char *e = json_string_value(expected);
        int kind_ok = -1;
        if (strcmp(e, "$any") == 0)
            kind_ok = 1;
        else if (strcmp(e, "$int") == 0)
            kind_ok = json_is_integer(got) || is_bigint(got);
        else if (strcmp(e, "$number") == 0)
            kind_ok = json_is_number(got) || is_bigint(got);
        else if (strcmp(e, "$string") == 0)
            kind_ok = json_is_string(got);
        else if (strcmp(e, "$list") == 0)
            kind_ok = json_is_array(got);
        else if (strcmp(e, "$object") == 0)
            kind_ok = json_is_object(got);
        else if (e[0] == '~')
            kind_ok = json_is_string(got) && strstr(json_string_value(got), e + 1) != NULL;
        if (kind_ok >= 0)
            return kind_ok ? NULL : why(path, "expected ", expected, ", got ", got);
    }
    if (json_is_object(expected) && !is_bigint(expected)) {
        if (!json_is_object(got))
            return why(path, "expected an object ", expected, ", got ", got);
        const char *key;
        json_t *value;
        json_object_foreach((json_t *)expected, key, value) {
            cod_buf sub = {0};
            cod_buf_printf(&sub, "%s.%s", path, key);
            json_t *g = json_object_get(got, key);
            char *w = g ? mismatch(value, g, sub.p) : why(sub.p, "missing, expected ", value, "", NULL);
            cod_buf_free(&sub);
            if (w)
                return w;
        }
        return NULL;
    }
    if (json_is_array(expected)) {
        if (!json_is_array(got) || json_array_size(got) != json_array_size(expected))
            return why(path, "expected the list ", expected, ", got ", got);
        for (size_t i = 0; i < json_array_size(expected); i++) {
            cod_buf sub = {0};
            cod_buf_printf(&sub, "%s[%zu]", path, i);
            char *w = mismatch(json_array_get(expected, i), json_array_get(got, i), sub.p);
            cod_buf_free(&sub);
            if (w)
                return w;
        }
        return NULL;
    }
    /* Scalars: equal values of the same JSON type (1 is not 1.0). */
    if (json_typeof(expected) != json_typeof(got) || !json_equal((json_t *)expected, (json_t *)got))
        return why(path, "expected ", expected, ", got ", got);
    return NULL;
}

static char *run_case(const char *sock, size_t index, const json_t *kase)
{
    char app[32];
    snprintf(app, sizeof app, "conf_%zu", index);
    cod_conn *c = cod_connect(sock, app);
    if (!c) {
        cod_buf b = {0};
        cod_buf_printf(&b, "connect: %s", cod_connect_error());
        return cod_buf_take(&b);
    }
    char *w = NULL;
    size_t i;
    json_t *step;
    json_array_foreach(json_object_get(kase, "setup"), i, step) {
        char *params = json_dumps(json_array_get(step, 1), JSON_COMPACT);
        cod_reply *r = cod_call(c, json_string_value(json_array_get(step, 0)), params);
        free(params);
        if (!r) {
            cod_buf b = {0};
            cod_buf_printf(&b, "setup %zu failed: %s", i, cod_errstr(c));
            cod_free(c);
            return cod_buf_take(&b);
        }
        cod_reply_free(r);
    }
    json_t *call = json_object_get(kase, "call");
    char *params = json_dumps(json_array_get(call, 1), JSON_COMPACT);
    cod_reply *r = cod_call(c, json_string_value(json_array_get(call, 0)), params);
    free(params);
    json_t *want_result = json_object_get(kase, "result");
    json_t *want_error = json_object_get(kase, "error");
    cod_buf b = {0};
    if (r && want_result) {
        w = mismatch(want_result, (const json_t *)cod_reply_result(r), "result");
    } else if (r) {
        cod_buf_printf(&b, "expected error %lld, got a result", (long long)json_integer_value(json_object_get(want_error, "code")));
        w = cod_buf_take(&b);
    } else if (!want_error || cod_server_code(c) == 0) {
        cod_buf_printf(&b, "unexpected error: %s", cod_errstr(c));
        w = cod_buf_take(&b);
    } else if (cod_server_code(c) != json_integer_value(json_object_get(want_error, "code"))) {
        cod_buf_printf(&b, "error code %lld (%s), expected %lld", cod_server_code(c), cod_errstr(c),
                       (long long)json_integer_value(json_object_get(want_error, "code")));
        w = cod_buf_take(&b);
    } else {
        json_t *msg = json_string(cod_errstr(c));
        json_t *want_msg = json_object_get(want_error, "message");
        w = want_msg ? mismatch(want_msg, msg, "error.message") : NULL;
        json_decref(msg);
        json_t *want_data = json_object_get(want_error, "data");
        if (!w && want_data) {
            const json_t *data = (const json_t *)cod_server_data(c);
            json_t *none = json_null();
            w = mismatch(want_data, data ? data : none, "data");
        }
    }
    cod_reply_free(r);
    cod_free(c);
    return w;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOCKET CASES.json\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    cod_buf text = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        cod_buf_append(&text, chunk, n);
    fclose(f);
    char *err = NULL;
    json_t *doc = cod_json_parse(text.p, text.len, &err);
    cod_buf_free(&text);
    if (!doc) {
        fprintf(stderr, "%s: %s\n", argv[2], err);
        free(err);
        return 2;
    }
    int passed = 0, failed = 0;
    size_t i;
    json_t *kase;
    json_array_foreach(json_object_get(doc, "cases"), i, kase) {
        char *w = run_case(argv[1], i, kase);
        const char *name = json_string_value(json_object_get(kase, "name"));
        if (w) {
            printf("FAIL %s: %s\n", name, w);
            failed++;
        } else {
            printf("ok   %s\n", name);
            passed++;
        }
        free(w);
    }
    json_decref(doc);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
