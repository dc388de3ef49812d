/* Which JSON library for libcod: the same work done with jansson, cJSON and json-c.
 *
 * Built three times (make -C clients/c json-choice), once per library
 * (-DUSE_JANSSON, -DUSE_CJSON, -DUSE_JSONC): jansson and json-c both export
 * json_object_get, so they cannot share one binary.  Prints one JSON object:
 * the library, ns per operation for the three shapes libcod handles, and
 * what each library does with the inputs a daemon may really send.
 *
 *   parse_small  a single-fact query reply (~70 bytes): parse, read id and X, free
 *   parse_1mib   a 1 MiB reply of 7,000 solutions: parse, read every value, free
 *   encode_facts an add_facts request of 10,000 facts: build and serialize
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(USE_JANSSON)
#include <jansson.h>
#define LIB "jansson"
#elif defined(USE_CJSON)
#include <cjson/cJSON.h>
#define LIB "cJSON"
#elif defined(USE_JSONC)
#include <json-c/json.h>
#define LIB "json-c"
#else
#error "define USE_JANSSON, USE_CJSON or USE_JSONC"
#endif

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static volatile long long sink;

/* ---- one backend: parse(text, len) -> handle; walk(handle) -> checksum; encode(n) -> bytes ---- */
#if defined(USE_JANSSON)
typedef json_t doc;
/* With the flags libcod uses: NUL allowed in strings, duplicate keys refused. */
static doc *parse(const char *s, size_t n) { return json_loadb(s, n, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, NULL); }
static void read_big(char *out, size_t n)
{
    json_error_t err;
    json_t *d = json_loads("[1180591620717411303424]", 0, &err);
    if (!d)
        snprintf(out, n, "refused: %s", err.text);
    else
        snprintf(out, n, "%lld", (long long)json_integer_value(json_array_get(d, 0)));
    json_decref(d);
}
static void drop(doc *d) { json_decref(d); }
static long long walk_value(json_t *v)
{
    long long sum = 0;
    size_t i;
    json_t *e;
    const char *k;
    switch (json_typeof(v)) {
    case JSON_INTEGER: return json_integer_value(v);
    case JSON_REAL: return (long long)json_real_value(v);
    case JSON_STRING: return (long long)json_string_length(v);
    case JSON_ARRAY: json_array_foreach(v, i, e) sum += walk_value(e); return sum;
    case JSON_OBJECT: json_object_foreach(v, k, e) sum += walk_value(e); return sum;
    default: return 0;
    }
}
static long long small_get(doc *d)
{
    json_t *sols = json_object_get(json_object_get(d, "result"), "solutions");
    return json_integer_value(json_object_get(d, "id")) +
           json_integer_value(json_object_get(json_array_get(sols, 0), "X"));
}
static long long walk(doc *d) { return walk_value(json_object_get(json_object_get(d, "result"), "solutions")); }
static size_t encode(int n)
{
    json_t *facts = json_array();
    char buf[64];
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "bench_fact(%d, 12345)", i);
        json_array_append_new(facts, json_string(buf));
    }
    json_t *req = json_pack("{s:s, s:i, s:s, s:{s:o}}", "jsonrpc", "2.0", "id", 7, "method", "add_facts",
                            "params", "facts", facts);
    char *out = json_dumps(req, JSON_COMPACT);
    size_t len = strlen(out);
    free(out);
    json_decref(req);
    return len;
}
#elif defined(USE_CJSON)
typedef cJSON doc;
static doc *parse(const char *s, size_t n) { return cJSON_ParseWithLength(s, n); }
static void read_big(char *out, size_t n)
{
    cJSON *d = cJSON_Parse("[1180591620717411303424]");
    snprintf(out, n, "read as the double %.17g", cJSON_GetArrayItem(d, 0)->valuedouble);
    cJSON_Delete(d);
}
static void drop(doc *d) { cJSON_Delete(d); }
static long long walk_value(cJSON *v)
{
    long long sum = 0;
    cJSON *e;
    if (cJSON_IsNumber(v)) return (long long)v->valuedouble;
    if (cJSON_IsString(v)) return (long long)strlen(v->valuestring);
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) { cJSON_ArrayForEach(e, v) sum += walk_value(e); }
    return sum;
}
static long long small_get(doc *d)
{
    cJSON *sols = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "result"), "solutions");
    return (long long)cJSON_GetObjectItemCaseSensitive(d, "id")->valuedouble +
           (long long)cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(sols, 0), "X")->valuedouble;
}
static long long walk(doc *d)
{
    return walk_value(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "result"), "solutions"));
}
static size_t encode(int n)
{
    cJSON *req = cJSON_CreateObject(), *params = cJSON_CreateObject(), *facts = cJSON_CreateArray();
    char buf[64];
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "bench_fact(%d, 12345)", i);
        cJSON_AddItemToArray(facts, cJSON_CreateString(buf));
    }
    cJSON_AddStringToObject(req, "jsonrpc", "2.0");
    cJSON_AddNumberToObject(req, "id", 7);
    cJSON_AddStringToObject(req, "method", "add_facts");
    cJSON_AddItemToObject(params, "facts", facts);
    cJSON_AddItemToObject(req, "params", params);
    char *out = cJSON_PrintUnformatted(req);
    size_t len = strlen(out);
    free(out);
    cJSON_Delete(req);
    return len;
}
#else
typedef struct json_object doc;
static doc *parse(const char *s, size_t n)
{
    struct json_tokener *t = json_tokener_new_ex(2048);
    json_tokener_set_flags(t, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    doc *d = json_tokener_parse_ex(t, s, (int)n);
    if (json_tokener_get_error(t) != json_tokener_success || json_tokener_get_parse_end(t) != n) {
        json_object_put(d);
        d = NULL;
    }
    json_tokener_free(t);
    return d;
}
static void drop(doc *d) { json_object_put(d); }
static void read_big(char *out, size_t n)
{
    struct json_object *d = json_tokener_parse("[1180591620717411303424]");
    snprintf(out, n, "read as %s", json_object_to_json_string(json_object_array_get_idx(d, 0)));
    json_object_put(d);
}
static long long walk_value(struct json_object *v)
{
    long long sum = 0;
    switch (json_object_get_type(v)) {
    case json_type_int: return json_object_get_int64(v);
    case json_type_double: return (long long)json_object_get_double(v);
    case json_type_string: return json_object_get_string_len(v);
    case json_type_array:
        for (size_t i = 0; i < json_object_array_length(v); i++) sum += walk_value(json_object_array_get_idx(v, i));
        return sum;
    case json_type_object: {
        json_object_object_foreach(v, k, e) { (void)k; sum += walk_value(e); }
        return sum;
    }
    default: return 0;
    }
}
static struct json_object *get(struct json_object *o, const char *k)
{
    struct json_object *v = NULL;
    json_object_object_get_ex(o, k, &v);
    return v;
}
static long long small_get(doc *d)
{
    return json_object_get_int64(get(d, "id")) +
           json_object_get_int64(get(json_object_array_get_idx(get(get(d, "result"), "solutions"), 0), "X"));
}
static long long walk(doc *d) { return walk_value(get(get(d, "result"), "solutions")); }
static size_t encode(int n)
{
    struct json_object *req = json_object_new_object(), *params = json_object_new_object();
    struct json_object *facts = json_object_new_array();
    char buf[64];
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "bench_fact(%d, 12345)", i);
        json_object_array_add(facts, json_object_new_string(buf));
    }
    json_object_object_add(req, "jsonrpc", json_object_new_string("2.0"));
    json_object_object_add(req, "id", json_object_new_int(7));
    json_object_object_add(req, "method", json_object_new_string("add_facts"));
    json_object_object_add(params, "facts", facts);
    json_object_object_add(req, "params", params);
    size_t len = strlen(json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    json_object_put(req);
    return len;
}
#endif

static char *big_reply(size_t *len)
{
    size_t cap = 1 << 21, n = 0;
    char *s = malloc(cap);
    n += (size_t)sprintf(s, "{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"solutions\":[");
    for (int i = 0; n < 1048576 - 200; i++)
        n += (size_t)sprintf(s + n, "%s{\"Cpu\":%d,\"Node\":\"node_%d\",\"L\":[1,2,3.5],\"T\":{\"functor\":\"f\",\"args\":[%d,\"a\",null]}}",
                             i ? "," : "", i, i % 8, i);
    n += (size_t)sprintf(s + n, "]}}");
    *len = n;
    return s;
}

/* What the library does with an input: "ok", "error" or what it read. */
static const char *verdict(const char *text)
{
    doc *d = parse(text, strlen(text));
    if (!d) return "rejected";
    drop(d);
    return "accepted";
}

static double median(double *xs, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && xs[j - 1] > xs[j]; j--) {
            double t = xs[j]; xs[j] = xs[j - 1]; xs[j - 1] = t;
        }
    return xs[n / 2];
}

int main(void)
{
    const char *small = "{\"jsonrpc\":\"2.0\",\"id\":12345,\"result\":{\"solutions\":[{\"X\":42}]}}";
    size_t small_len = strlen(small), big_len;
    char *big = big_reply(&big_len);
    enum { ROUNDS = 7 };
    double t_small[ROUNDS], t_big[ROUNDS], t_enc[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < 100000; i++) {
            doc *d = parse(small, small_len);
            sink += small_get(d);
            drop(d);
        }
        t_small[r] = (now_ns() - t0) / 100000;
        t0 = now_ns();
        for (int i = 0; i < 5; i++) {
            doc *d = parse(big, big_len);
            sink += walk(d);
            drop(d);
        }
        t_big[r] = (now_ns() - t0) / 5;
        t0 = now_ns();
        for (int i = 0; i < 5; i++) sink += (long long)encode(10000);
        t_enc[r] = (now_ns() - t0) / 5;
    }
    /* Exactness of a 64-bit integer: read back through the library's integer accessor. */
    const char *i64 = "{\"result\":{\"solutions\":[{\"X\":9007199254740993}]},\"id\":0}";
    doc *d = parse(i64, strlen(i64));
    long long got = d ? small_get(d) : -1;
    if (d) drop(d);
    char big_reading[256];
    read_big(big_reading, sizeof big_reading);
    char deep[4100];
    for (int i = 0; i < 1000; i++) deep[i] = '[';
    for (int i = 0; i < 1000; i++) deep[1000 + i] = ']';
    deep[2000] = 0;
    printf("{\"library\": \"%s\", \"parse_small_ns\": %.0f, \"parse_1mib_ms\": %.2f, \"encode_10000_facts_ms\": %.2f, "
           "\"int_2_53_plus_1_exact\": %s, \"integer_2_70\": \"%s\", \"invalid_utf8\": \"%s\", "
           "\"nesting_1000\": \"%s\", \"trailing_garbage\": \"%s\", \"nul_escape\": \"%s\"}\n",
           LIB, median(t_small, ROUNDS), median(t_big, ROUNDS) / 1e6, median(t_enc, ROUNDS) / 1e6,
           got == 9007199254740993LL ? "true" : "false", big_reading,
           verdict("[\"\xff\xfe\"]"), verdict(deep), verdict("{\"a\":1} x"), verdict("[\"a\\u0000b\"]"));
    free(big);
    return 0;
}
