/* A growable byte buffer: no fixed sizes anywhere in libcod. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int cod_buf_reserve(cod_buf *b, size_t extra)
{
    if (b->cap - b->len > extra)
        return 0;  /* keeps one byte for the terminating NUL */
    size_t need = b->len + extra + 1;
    if (need < b->len)
        return COD_ENOMEM;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > ((size_t)-1) / 2)
            return COD_ENOMEM;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return COD_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int cod_buf_append(cod_buf *b, const void *s, size_t n)
{
    if (cod_buf_reserve(b, n))
        return COD_ENOMEM;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int cod_buf_puts(cod_buf *b, const char *s) { return cod_buf_append(b, s, strlen(s)); }

int cod_buf_putc(cod_buf *b, char ch) { return cod_buf_append(b, &ch, 1); }

int cod_buf_printf(cod_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || cod_buf_reserve(b, (size_t)n))
        return COD_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

char *cod_buf_take(cod_buf *b)
{
    if (!b->p && cod_buf_reserve(b, 0))
        return NULL;
    char *p = b->p;
    p[b->len] = 0;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void cod_buf_free(cod_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* s as a JSON string literal; COD_EINVAL if it is not UTF-8. */
int cod_buf_json_string(cod_buf *b, const char *s, size_t n)
{
    if (!cod_utf8_valid(s, n))
        return COD_EINVAL;
    if (cod_buf_reserve(b, n + 2))
        return COD_ENOMEM;
    b->p[b->len++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        int rc = 0;
        if (ch == '"' || ch == '\\') {
            char esc[2] = {'\\', (char)ch};
            rc = cod_buf_append(b, esc, 2);
        } else if (ch < 0x20) {
            rc = cod_buf_printf(b, "\\u%04x", ch);
        } else {
            if (b->len + 1 >= b->cap && cod_buf_reserve(b, 1))
                return COD_ENOMEM;
            b->p[b->len++] = (char)ch;
            continue;
        }
        if (rc)
            return COD_ENOMEM;
    }
    return cod_buf_putc(b, '"') ? COD_ENOMEM : 0;
}

static int dump_cb(const char *s, size_t n, void *data) { return cod_buf_append(data, s, n) ? -1 : 0; }

int cod_buf_dump_json(cod_buf *b, const json_t *v)
{
    return json_dump_callback(v, dump_cb, b, JSON_COMPACT | JSON_ENCODE_ANY) ? COD_ENOMEM : 0;
}
