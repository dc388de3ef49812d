/* The protocol reader: frames and JSON-RPC messages from bytes, with no I/O (reader.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A Prolog integer beyond 64 bits is carried as {"$bigint": "digits"}: no variable name
 * or protocol field starts with '$', so the marker cannot meet a real object. */
#define BIGINT_KEY "$bigint"

void cod_reader_init(cod_reader *r, size_t max_frame)
{
    memset(r, 0, sizeof *r);
    r->max_frame = max_frame;
}

void cod_reader_release(cod_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

void cod_reader_reset(cod_reader *r) { r->off = r->len = 0; }

size_t cod_reader_pending(const cod_reader *r) { return r->len - r->off; }

char *cod_reader_space(cod_reader *r, size_t want, size_t *got)
{
    if (want == 0)
        want = 1;
    if (r->off == r->len)
        r->off = r->len = 0;
    if (r->cap - r->len < want && r->off > 0) {
        /* Slide the unread bytes to the front before growing. */
        memmove(r->buf, r->buf + r->off, r->len - r->off);
        r->len -= r->off;
        r->off = 0;
    }
    if (r->cap - r->len < want) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap - r->len < want) {
            if (cap > ((size_t)-1) / 2)
                return NULL;
            cap *= 2;
        }
        char *p = realloc(r->buf, cap);
        if (!p)
            return NULL;
        r->buf = p;
        r->cap = cap;
    }
    *got = r->cap - r->len;
    return r->buf + r->len;
}

void cod_reader_wrote(cod_reader *r, size_t n) { r->len += n; }

int cod_reader_feed(cod_reader *r, const void *data, size_t n)
{
    if (n == 0)
        return 0;
    size_t got;
    char *p = cod_reader_space(r, n, &got);
    if (!p)
        return COD_ENOMEM;
    if (n)
        memcpy(p, data, n);
    r->len += n;
    return 0;
}

/* ---- JSON with exact big integers ---- */

/* Rewrites every integer literal that does not fit in long long as {"$bigint":"digits"}. */
static char *quote_bigints(const char *s, size_t n, size_t *outlen)
{
    cod_buf b = {0};
    size_t i = 0;
    while (i < n) {
        char ch = s[i];
        if (ch == '"') {  /* copy a string literal whole */
            size_t j = i + 1;
            while (j < n && s[j] != '"')
                j += (s[j] == '\\') ? 2 : 1;
            j = j < n ? j + 1 : n;
            if (cod_buf_append(&b, s + i, j - i))
                goto oom;
            i = j;
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            size_t j = i + (ch == '-');
            while (j < n && s[j] >= '0' && s[j] <= '9')
                j++;
            int is_int = !(j < n && (s[j] == '.' || s[j] == 'e' || s[j] == 'E'));
            size_t k = j;
            while (k < n && (s[k] == '.' || s[k] == 'e' || s[k] == 'E' || s[k] == '+' || s[k] == '-' ||
                             (s[k] >= '0' && s[k] <= '9')))
                k++;
            int big = 0;
            if (is_int && j > i + (ch == '-')) {
                char *tmp = strndup(s + i, j - i);
                if (!tmp)
                    goto oom;
                errno = 0;
                (void)strtoll(tmp, NULL, 10);
                big = errno == ERANGE;
                free(tmp);
            }
            if (big) {
                if (cod_buf_puts(&b, "{\"" BIGINT_KEY "\":\"") || cod_buf_append(&b, s + i, j - i) ||
                    cod_buf_puts(&b, "\"}"))
                    goto oom;
            } else if (cod_buf_append(&b, s + i, k - i)) {
                goto oom;
            }
            i = k;
        } else {
            if (cod_buf_putc(&b, ch))
                goto oom;
            i++;
        }
    }
    *outlen = b.len;
    return cod_buf_take(&b);
oom:
    cod_buf_free(&b);
    return NULL;
}

json_t *cod_json_parse(const char *text, size_t len, char **why)
{
    json_error_t err;
    const size_t flags = JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES;
    json_t *v = json_loadb(text, len, flags, &err);
    if (!v && json_error_code(&err) == json_error_numeric_overflow) {
        size_t n2;
        char *t2 = quote_bigints(text, len, &n2);
        if (t2) {
            v = json_loadb(t2, n2, flags, &err);
            free(t2);
        }
    }
    if (!v && why) {
        cod_buf b = {0};
        cod_buf_printf(&b, "%s at byte %ld", err.text, (long)err.position);
        *why = cod_buf_take(&b);
    }
    return v;
}

/* ---- messages ---- */

void cod_msg_release(cod_msg *m)
{
    json_decref(m->root);
    free(m->why);
    memset(m, 0, sizeof *m);
}

static int bad(cod_msg *m, const char *what, const char *detail)
{
    cod_buf b = {0};
    cod_buf_printf(&b, "%s%s", what, detail ? detail : "");
    m->kind = COD_MSG_BAD;
    m->why = cod_buf_take(&b);
    return 1;
}

/* Classifies a parsed frame body. */
static int classify(cod_msg *m)
{
    json_t *root = m->root;
    if (!json_is_object(root))
        return bad(m, "a frame that is not a JSON object", NULL);
    json_t *method = json_object_get(root, "method");
    json_t *id = json_object_get(root, "id");
    if (json_is_string(method) && !json_object_get(root, "result") && !json_object_get(root, "error")) {
        if (id && !json_is_null(id))
            return bad(m, "the daemon sent a request, which no client serves: ", json_string_value(method));
        json_t *params = json_object_get(root, "params");
        if (!params) {
            params = json_object();
            if (!params || json_object_set_new(root, "params", params))
                return COD_ENOMEM;
        }
        if (!json_is_object(params))
            return bad(m, "an upcall whose params are not an object: ", json_string_value(method));
        m->kind = COD_MSG_UPCALL;
        m->method = json_string_value(method);
        m->params = params;
        return 1;
    }
    json_t *result = json_object_get(root, "result");
    json_t *error = json_object_get(root, "error");
    if ((result != NULL) == (error != NULL))
        return bad(m, "a message that is neither a response nor an upcall", NULL);
    if (error) {
        json_t *code = json_object_get(error, "code");
        json_t *message = json_object_get(error, "message");
        if (!json_is_object(error) || !json_is_integer(code) || (message && !json_is_string(message)))
            return bad(m, "a malformed error object", NULL);
    }
    m->kind = COD_MSG_REPLY;
    if (json_is_integer(id)) {
        m->has_id = 1;
        m->id = json_integer_value(id);
    }
    m->result = result;
    m->error = error;
    return 1;
}

int cod_reader_next(cod_reader *r, cod_msg *m)
{
    memset(m, 0, sizeof *m);
    size_t avail = r->len - r->off;
    if (avail < 4)
        return 0;
    const unsigned char *h = (const unsigned char *)r->buf + r->off;
    size_t size = ((size_t)h[0] << 24) | ((size_t)h[1] << 16) | ((size_t)h[2] << 8) | (size_t)h[3];
    if (size > r->max_frame) {
        cod_buf b = {0};
        cod_buf_printf(&b, "the daemon sent a frame of %zu bytes, over the limit of %zu bytes", size, r->max_frame);
        m->kind = COD_MSG_BAD;
        m->why = cod_buf_take(&b);
        return COD_EPROTO;
    }
    if (avail - 4 < size)
        return 0;
    const char *body = r->buf + r->off + 4;
    r->off += 4 + size;
    char *why = NULL;
    m->root = cod_json_parse(body, size, &why);
    if (!m->root) {
        int rc = bad(m, "a frame that is not JSON: ", why);
        free(why);
        return rc;
    }
    return classify(m);
}
