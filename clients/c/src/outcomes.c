/* Writes with request keys (docs/protocol.md, "Write outcomes").  Every typed write carries a
 * fresh request_key.  A write whose outcome is unknown (the daemon's -32080, or no reply once the
 * whole request had left) is kept for its thread; cod_retry sends it again with the same key, and
 * the daemon answers with the first run's outcome instead of writing twice. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "internal.h"

#define KEY_HEX (COD_REQUEST_KEY_LEN - 1)

/* 128 random bits as hex digits: a key nobody else picks. */
int cod_new_request_key(char out[KEY_HEX + 1])
{
    unsigned char raw[KEY_HEX / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return COD_ESYSTEM;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* params (a JSON object's text) with "request_key": key as its last member. */
static int with_key(cod_buf *b, const char *params, size_t plen, const char *key)
{
    size_t end = plen;
    while (end > 0 && params[end - 1] != '}')
        end--;
    if (end == 0)
        return COD_EINVAL;
    size_t inner = end - 1;
    while (inner > 0 && (params[inner - 1] == ' ' || params[inner - 1] == '\n'))
        inner--;
    int empty = inner > 0 && params[inner - 1] == '{';
    if (cod_buf_append(b, params, end - 1) || cod_buf_puts(b, empty ? "" : ",") ||
        cod_buf_printf(b, "\"request_key\":\"%s\"}", key))
        return COD_ENOMEM;
    return 0;
}

/* This thread's write to retry (method NULL: none any more). */
static void keep_unsettled(cod_conn *c, const char *method, const char *params, size_t plen, const char *key)
{
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, method != NULL);
    if (e) {
        free(e->unsettled_method);
        free(e->unsettled_params);
        free(e->unsettled_key);
        e->unsettled_method = method ? strdup(method) : NULL;
        e->unsettled_params = method ? strndup(params, plen) : NULL;
        e->unsettled_key = method ? strdup(key) : NULL;
    }
    pthread_mutex_unlock(&c->mu);
}

/* One round trip of a keyed write: kept when its outcome is unknown, forgotten when it is known. */
static int send_keyed(cod_conn *c, const char *method, const char *params, size_t plen, const char *key,
                      json_t **reply)
{
    int rc = cod_roundtrip_write(c, method, params, plen, reply);
    if (rc == COD_EUNKNOWN)
        keep_unsettled(c, method, params, plen, key);
    else
        keep_unsettled(c, NULL, NULL, 0, NULL);
    return rc;
}

int cod_keyed_write(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply)
{
    *reply = NULL;
    char key[KEY_HEX + 1];
    if (cod_new_request_key(key))
        return cod_set_error(c, COD_ESYSTEM, 0, NULL, "%s: no random bytes for its request key: %s", method,
                             strerror(errno));
    cod_buf b = {0};
    int rc = with_key(&b, params, plen, key);
    if (rc == 0)
        rc = send_keyed(c, method, b.p, b.len, key, reply);
    else
        rc = cod_set_error(c, rc, 0, NULL, "%s: %s", method, rc == COD_ENOMEM ? "out of memory" : "params are not an object");
    cod_buf_free(&b);
    return rc;
}

int cod_keyed_call(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply)
{
    *reply = NULL;
    json_t *p = cod_json_parse(params, plen, NULL);
    const char *key = json_string_value(json_object_get(p, "request_key"));
    int rc = key ? send_keyed(c, method, params, plen, key, reply) : cod_roundtrip_write(c, method, params, plen, reply);
    json_decref(p);
    return rc;
}

int cod_retry(cod_conn *c)
{
    if (!c)
        return COD_EINVAL;
    pthread_mutex_lock(&c->io);
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    char *method = e && e->unsettled_method ? strdup(e->unsettled_method) : NULL;
    char *params = e && e->unsettled_params ? strdup(e->unsettled_params) : NULL;
    char *key = e && e->unsettled_key ? strdup(e->unsettled_key) : NULL;
    pthread_mutex_unlock(&c->mu);
    int rc;
    if (!method || !params || !key) {
        rc = cod_set_error(c, method ? COD_ENOMEM : COD_EINVAL, 0, NULL,
                           method ? "cod_retry: out of memory" : "cod_retry: this thread has no write whose outcome is unknown");
    } else {
        json_t *reply = NULL;
        rc = send_keyed(c, method, params, strlen(params), key, &reply);
        if (rc == 0) {
            json_t *sent = cod_json_parse(params, strlen(params), NULL);
            json_t *result = json_object_get(reply, "result");
            cod_state_note(c, method, sent, result);
            if (strcmp(method, "remove_facts") == 0) {
                json_int_t n = json_integer_value(json_object_get(result, "removed"));
                rc = n > 2147483647 ? 2147483647 : (int)n;
            }
            json_decref(sent);
        }
        json_decref(reply);
    }
    pthread_mutex_unlock(&c->io);
    free(method);
    free(params);
    free(key);
    return rc;
}

const char *cod_request_key(const cod_conn *cc)
{
    if (!cc)
        return NULL;
    cod_conn *c = (cod_conn *)cc;
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    const char *key = e ? e->unsettled_key : NULL;
    pthread_mutex_unlock(&c->mu);
    return key;
}
