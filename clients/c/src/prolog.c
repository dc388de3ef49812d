/* Prolog text: quoting, the formatting calls' templates, and the pattern matcher that lets
 * the held state forget facts removed by a pattern.  No I/O. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- quoting ---- */

/* Lower-case words that SWI-Prolog reads as operators when unquoted; quoted, they are plain atoms. */
static const char *const word_operators[] = {
    "as", "discontiguous", "div", "dynamic", "initialization", "is", "meta_predicate", "mod",
    "module_transparent", "multifile", "public", "rdiv", "rem", "table", "thread_initialization",
    "thread_local", "volatile", "xor", NULL};

static int is_lower(char c) { return c >= 'a' && c <= 'z'; }
static int is_alnum_(char c) { return is_lower(c) || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

static int plain_atom(const char *s, size_t n)
{
    if (n == 0 || !is_lower(s[0]))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!is_alnum_(s[i]))
            return 0;
    for (const char *const *w = word_operators; *w; w++)
        if (strlen(*w) == n && memcmp(*w, s, n) == 0)
            return 0;
    return 1;
}

static int quote_to(cod_buf *b, const char *s, size_t n, char q)
{
    if (!cod_utf8_valid(s, n))
        return COD_EINVAL;
    if (cod_buf_reserve(b, n + 2) || cod_buf_putc(b, q))
        return COD_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int rc;
        if (c == (unsigned char)q || c == '\\') {
            char esc[2] = {'\\', (char)c};
            rc = cod_buf_append(b, esc, 2);
        } else if (c == '\n') {
            rc = cod_buf_append(b, "\\n", 2);
        } else if (c == '\t') {
            rc = cod_buf_append(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            rc = cod_buf_printf(b, "\\x%x\\", c);
        } else {
            rc = cod_buf_putc(b, (char)c);
        }
        if (rc)
            return COD_ENOMEM;
    }
    return cod_buf_putc(b, q) ? COD_ENOMEM : 0;
}

int cod_quote_atom_to(cod_buf *b, const char *s, size_t n)
{
    if (plain_atom(s, n))
        return cod_buf_append(b, s, n);
    return quote_to(b, s, n, '\'');
}

int cod_quote_string_to(cod_buf *b, const char *s, size_t n) { return quote_to(b, s, n, '"'); }

static char *quote_public(const char *text, int (*fn)(cod_buf *, const char *, size_t))
{
    if (!text) {
        errno = EINVAL;
        return NULL;
    }
    cod_buf b = {0};
    int rc = fn(&b, text, strlen(text));
    if (rc) {
        cod_buf_free(&b);
        errno = rc == COD_ENOMEM ? ENOMEM : EINVAL;
        return NULL;
    }
    return cod_buf_take(&b);
}

char *cod_quote_atom(const char *text) { return quote_public(text, cod_quote_atom_to); }
char *cod_quote_string(const char *text) { return quote_public(text, cod_quote_string_to); }

/* ---- templates ---- */

/* A negative number right after a term or a symbol character would merge with it
 * ("a-%d" with -1 gives "a--1", where "--" is one atom): parenthesize it there. */
static int needs_parens(const cod_buf *b)
{
    if (b->len == 0)
        return 0;
    char c = b->p[b->len - 1];
    return !(c == '(' || c == ',' || c == '[' || c == '{' || c == '|' || c == ' ' || c == '\t' || c == '\n');
}

static int put_int(cod_buf *b, long long v, unsigned long long u, int is_unsigned, int hex)
{
    if (is_unsigned)
        return hex ? cod_buf_printf(b, "0x%llx", u) : cod_buf_printf(b, "%llu", u);
    if (v < 0 && needs_parens(b))
        return cod_buf_printf(b, "(%lld)", v);
    return cod_buf_printf(b, "%lld", v);
}

/* Shortest text that reads back as the same double, in Prolog float syntax (1.0, 1.0e10). */
static int put_float(cod_buf *b, double d)
{
    char tmp[64];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    char out[72];
    char *e = strchr(tmp, 'e');
    if (!strchr(tmp, '.')) {
        if (e) {
            size_t head = (size_t)(e - tmp);
            snprintf(out, sizeof out, "%.*s.0%s", (int)head, tmp, e);
        } else {
            snprintf(out, sizeof out, "%s.0", tmp);
        }
    } else {
        snprintf(out, sizeof out, "%s", tmp);
    }
    if (d < 0 && needs_parens(b))
        return cod_buf_printf(b, "(%s)", out);
    return cod_buf_puts(b, out);
}

static int fail_why(char **why, const char *what, const char *detail, const char *after)
{
    if (why) {
        cod_buf m = {0};
        cod_buf_printf(&m, "%s%s%s", what, detail, after);
        *why = cod_buf_take(&m);
    }
    return COD_EINVAL;
}

/* The length modifiers a conversion may carry: none, hh, h, l, ll, z, j, t. */
enum length { LEN_NONE, LEN_HH, LEN_H, LEN_L, LEN_LL, LEN_Z, LEN_J, LEN_T };

/* The length modifier at *pp, if any; *pp is left at the character after it (the
 * conversion's letter in a well-formed template). */
static enum length parse_length(const char **pp)
{
    const char *p = *pp;
    enum length len = LEN_NONE;
    if (*p == 'h') {
        len = LEN_H;
        if (p[1] == 'h') {
            len = LEN_HH;
            p++;
        }
        p++;
    } else if (*p == 'l') {
        len = LEN_L;
        if (p[1] == 'l') {
            len = LEN_LL;
            p++;
        }
        p++;
    } else if (*p == 'z') {
        len = LEN_Z;
        p++;
    } else if (*p == 'j') {
        len = LEN_J;
        p++;
    } else if (*p == 't') {
        len = LEN_T;
        p++;
    }
    *pp = p;
    return len;
}

/* The argument of %d or %i, read as the type its length modifier names (char and short
 * arrive promoted to int).  args points at the caller's va_list (C11 7.16 allows that), so
 * the caller's next conversion reads the argument after this one. */
static long long signed_arg(va_list *args, enum length len)
{
    switch (len) {
    case LEN_L: return va_arg(*args, long);
    case LEN_LL: return va_arg(*args, long long);
    case LEN_Z: return (long long)va_arg(*args, ssize_t);
    case LEN_J: return (long long)va_arg(*args, intmax_t);
    case LEN_T: return (long long)va_arg(*args, ptrdiff_t);
    case LEN_HH: return (signed char)va_arg(*args, int);
    case LEN_H: return (short)va_arg(*args, int);
    default: return va_arg(*args, int);
    }
}

/* The argument of %u or %x, as signed_arg reads that of %d. */
static unsigned long long unsigned_arg(va_list *args, enum length len)
{
    switch (len) {
    case LEN_L: return va_arg(*args, unsigned long);
    case LEN_LL: return va_arg(*args, unsigned long long);
    case LEN_Z: return va_arg(*args, size_t);
    case LEN_J: return (unsigned long long)va_arg(*args, uintmax_t);
    case LEN_T: return (unsigned long long)va_arg(*args, ptrdiff_t);
    case LEN_HH: return (unsigned char)va_arg(*args, unsigned);
    case LEN_H: return (unsigned short)va_arg(*args, unsigned);
    default: return va_arg(*args, unsigned);
    }
}

/* The literal text from *pp up to the next '%' or the end, copied as it is; *pp is left
 * at its last character. */
static int put_literal(cod_buf *b, const char **pp)
{
    const char *p = *pp, *q = p;
    while (q[1] && q[1] != '%')
        q++;
    *pp = q;
    return cod_buf_append(b, p, (size_t)(q - p + 1));
}

/* The error for a conversion this formatter does not take, quoting it from its '%'
 * (at most 30 characters of it). */
static int fail_unsupported(char **why, const char *spec)
{
    size_t n = strcspn(spec + 1, "dixufgesq%") + 2;
    char conv[32];
    snprintf(conv, sizeof conv, "%.*s", (int)(n < 30 ? n : 30), spec);
    return fail_why(why, "unsupported conversion \"", conv,
                    "\": use %d %i %u %x (hh h l ll z j t), %f %g %e, %s (an atom), %q (a string) or %%");
}

int cod_vformat_to(cod_buf *b, const char *fmt, va_list ap, char **why)
{
    if (!fmt)
        return fail_why(why, "no template given", "", "");
    if (!cod_utf8_valid(fmt, strlen(fmt)))
        return fail_why(why, "the template is not valid UTF-8", "", "");
    va_list args;
    va_copy(args, ap);
    int rc = 0;
    for (const char *p = fmt; *p && !rc; p++) {
        if (*p != '%') {
            rc = put_literal(b, &p);
            continue;
        }
        const char *spec = p++;
        enum length len = parse_length(&p);
        switch (*p) {
        case '%':
            rc = len ? COD_EINVAL : cod_buf_putc(b, '%');
            break;
        case 'd':
        case 'i':
            rc = put_int(b, signed_arg(&args, len), 0, 0, 0);
            break;
        case 'u':
        case 'x':
            rc = put_int(b, 0, unsigned_arg(&args, len), 1, *p == 'x');
            break;
        case 'f':
        case 'g':
        case 'e': {
            if (len && len != LEN_L) {
                rc = COD_EINVAL;
                break;
            }
            double d = va_arg(args, double);
            if (!isfinite(d)) {
                va_end(args);
                return fail_why(why, "a float that is not finite for a conversion", "", "");
            }
            rc = put_float(b, d);
            break;
        }
        case 's':
        case 'q': {
            if (len) {
                rc = COD_EINVAL;
                break;
            }
            const char *s = va_arg(args, const char *);
            if (!s) {
                va_end(args);
                return fail_why(why, "a NULL string for %", *p == 's' ? "s" : "q", "");
            }
            rc = *p == 's' ? cod_quote_atom_to(b, s, strlen(s)) : cod_quote_string_to(b, s, strlen(s));
            if (rc == COD_EINVAL) {
                va_end(args);
                return fail_why(why, "a string argument that is not valid UTF-8 for %", *p == 's' ? "s" : "q", "");
            }
            break;
        }
        default:
            rc = COD_EINVAL;
            break;
        }
        if (rc == COD_EINVAL) {
            va_end(args);
            return fail_unsupported(why, spec);
        }
        if (!*p)
            break;
    }
    va_end(args);
    return rc;
}

char *cod_vformat(const char *fmt, va_list ap)
{
    cod_buf b = {0};
    int rc = cod_vformat_to(&b, fmt, ap, NULL);
    if (rc) {
        cod_buf_free(&b);
        errno = rc == COD_ENOMEM ? ENOMEM : EINVAL;
        return NULL;
    }
    return cod_buf_take(&b);
}

char *cod_format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = cod_vformat(fmt, ap);
    va_end(ap);
    return s;
}

/* ---- matching a remove_facts pattern against a held fact ----
 *
 * Both texts are read as operator-free terms (atoms, numbers, strings, variables, compounds,
 * lists) and unified.  Anything outside that subset is COD_MATCH_UNKNOWN, and the caller
 * asks the daemon, whose reader and unification are the ones that count. */

enum { T_ATOM, T_INT, T_FLOAT, T_STR, T_VAR, T_NIL, T_COMP };

typedef struct term {
    int kind;
    char *text;        /* atom name, integer digits (normalized), string, variable name, functor */
    size_t len;
    double f;
    int var;           /* T_VAR: its slot in the binding table (number_vars) */
    size_t arity;
    struct term **args;
} term;

typedef struct reader {
    const char *s;
    size_t i, n;
    int fail;          /* outside the subset */
} reader;

static void term_free(term *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->arity; i++)
        term_free(t->args[i]);
    free(t->args);
    free(t->text);
    free(t);
}

static void skip_ws(reader *r)
{
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

static term *mk(int kind, const char *text, size_t len)
{
    term *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->kind = kind;
    if (text) {
        t->text = malloc(len + 1);
        if (!t->text) {
            free(t);
            return NULL;
        }
        memcpy(t->text, text, len);
        t->text[len] = 0;
        t->len = len;
    }
    return t;
}

static int add_arg(term *t, term *a)
{
    term **args = realloc(t->args, (t->arity + 1) * sizeof *args);
    if (!args)
        return -1;
    t->args = args;
    t->args[t->arity++] = a;
    return 0;
}

static int is_symbol_char(char c) { return c && strchr("+-*/\\^<>=~:.?@#&$", c) != NULL; }

/* A quoted item ('atom' or "string"): its unescaped text, or fail outside simple escapes. */
static term *read_quoted(reader *r, char q, int kind)
{
    cod_buf b = {0};
    r->i++;
    while (r->i < r->n) {
        char c = r->s[r->i];
        if (c == q) {
            if (r->i + 1 < r->n && r->s[r->i + 1] == q) {  /* doubled quote */
                cod_buf_putc(&b, q);
                r->i += 2;
                continue;
            }
            r->i++;
            term *t = mk(kind, b.p ? b.p : "", b.len);
            cod_buf_free(&b);
            return t;
        }
        if (c == '\\') {
            char e = r->i + 1 < r->n ? r->s[r->i + 1] : 0;
            const char *map = strchr("nt\\'\"`", e);
            if (!e || !map) {
                r->fail = 1;
                break;
            }
            cod_buf_putc(&b, e == 'n' ? '\n' : e == 't' ? '\t' : e);
            r->i += 2;
            continue;
        }
        if (c == '\n') {
            r->fail = 1;
            break;
        }
        cod_buf_putc(&b, c);
        r->i++;
    }
    r->fail = 1;
    cod_buf_free(&b);
    return NULL;
}

static term *read_number(reader *r)
{
    size_t start = r->i;
    int neg = r->s[r->i] == '-';
    if (neg)
        r->i++;
    size_t d0 = r->i;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')
        r->i++;
    int is_float = 0;
    if (r->i + 1 < r->n && r->s[r->i] == '.' && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9') {
        is_float = 1;
        r->i++;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')
            r->i++;
    }
    if (r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E') && is_float) {
        size_t k = r->i + 1;
        if (k < r->n && (r->s[k] == '+' || r->s[k] == '-'))
            k++;
        if (k < r->n && r->s[k] >= '0' && r->s[k] <= '9') {
            while (k < r->n && r->s[k] >= '0' && r->s[k] <= '9')
                k++;
            r->i = k;
        }
    }
    /* 0'c, 0x1f, 1_000, 1.0Inf and the like are outside the subset. */
    if (r->i < r->n && (is_alnum_(r->s[r->i]) || r->s[r->i] == '\'')) {
        r->fail = 1;
        return NULL;
    }
    if (is_float) {
        char *tmp = strndup(r->s + start, r->i - start);
        if (!tmp)
            return NULL;
        term *t = mk(T_FLOAT, NULL, 0);
        if (t)
            t->f = strtod(tmp, NULL);
        free(tmp);
        return t;
    }
    while (d0 + 1 < r->i && r->s[d0] == '0')
        d0++;
    cod_buf b = {0};
    int zero = r->i - d0 == 1 && r->s[d0] == '0';
    if ((neg && !zero && cod_buf_putc(&b, '-')) || cod_buf_append(&b, r->s + d0, r->i - d0)) {
        cod_buf_free(&b);
        return NULL;
    }
    term *t = mk(T_INT, b.p, b.len);
    cod_buf_free(&b);
    return t;
}

static term *read_term(reader *r, int depth);

static term *read_args(reader *r, term *t, char close, int depth)
{
    for (;;) {
        term *a = read_term(r, depth + 1);
        if (!a || add_arg(t, a)) {
            term_free(a);
            term_free(t);
            return NULL;
        }
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            return t;
        }
        r->fail = 1;
        term_free(t);
        return NULL;
    }
}

static term *cons(term *head, term *tail)
{
    term *cell = mk(T_COMP, "[|]", 3);
    if (!cell || add_arg(cell, head) || add_arg(cell, tail)) {
        if (cell) {
            term_free(cell);
        } else {
            term_free(head);
            term_free(tail);
        }
        return NULL;
    }
    return cell;
}

/* [a, b | T] as '[|]'(a, '[|]'(b, T)); [] as T_NIL. */
static term *read_list(reader *r, int depth)
{
    r->i++; /* [ */
    skip_ws(r);
    if (r->i < r->n && r->s[r->i] == ']') {
        r->i++;
        return mk(T_NIL, NULL, 0);
    }
    term *elems = mk(T_COMP, "elems", 5); /* a scratch holder of the elements */
    term *tail = NULL;
    if (!elems)
        return NULL;
    for (;;) {
        term *e = read_term(r, depth + 1);
        if (!e || add_arg(elems, e)) {
            term_free(e);
            term_free(elems);
            return NULL;
        }
        skip_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') {
            r->i++;
            continue;
        }
        if (r->i < r->n && r->s[r->i] == '|') {
            r->i++;
            tail = read_term(r, depth + 1);
            skip_ws(r);
            if (!tail)
                break;
        } else {
            tail = mk(T_NIL, NULL, 0);
        }
        if (tail && r->i < r->n && r->s[r->i] == ']') {
            r->i++;
            /* Build the cells from the last element back; the holder gives its elements away. */
            term *list = tail;
            while (list && elems->arity > 0)
                list = cons(elems->args[--elems->arity], list);
            term_free(elems);
            return list;
        }
        break;
    }
    r->fail = 1;
    term_free(tail);
    term_free(elems);
    return NULL;
}

static term *read_term(reader *r, int depth)
{
    skip_ws(r);
    if (depth > 200 || r->i >= r->n) {
        r->fail = 1;
        return NULL;
    }
    char c = r->s[r->i];
    size_t start = r->i;
    if (c == '-' && r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9')
        return read_number(r);
    if (c >= '0' && c <= '9')
        return read_number(r);
    if (c == '"')
        return read_quoted(r, '"', T_STR);
    if (c == '[')
        return read_list(r, depth);
    if (c == '(') {
        r->i++;
        term *t = read_term(r, depth + 1);
        skip_ws(r);
        if (t && r->i < r->n && r->s[r->i] == ')') {
            r->i++;
            return t;
        }
        r->fail = 1;
        term_free(t);
        return NULL;
    }
    if ((c >= 'A' && c <= 'Z') || c == '_') {
        while (r->i < r->n && is_alnum_(r->s[r->i]))
            r->i++;
        return mk(T_VAR, r->s + start, r->i - start);
    }
    term *name;
    if (c == '\'') {
        name = read_quoted(r, '\'', T_ATOM);
    } else if (is_lower(c)) {
        while (r->i < r->n && is_alnum_(r->s[r->i]))
            r->i++;
        name = mk(T_ATOM, r->s + start, r->i - start);
    } else if (is_symbol_char(c)) {
        while (r->i < r->n && is_symbol_char(r->s[r->i]))
            r->i++;
        name = mk(T_ATOM, r->s + start, r->i - start);
    } else {
        r->fail = 1;
        return NULL;
    }
    if (!name)
        return NULL;
    if (r->i < r->n && r->s[r->i] == '(') {
        r->i++;
        name->kind = T_COMP;
        return read_args(r, name, ')', depth);
    }
    return name;
}

/* Variables: each named variable of a text gets one slot; "_" a fresh one. */
typedef struct vars {
    char **names;
    int *slots;
    size_t n;
} vars;

static int number_vars(term *t, vars *v, int *next)
{
    if (t->kind == T_VAR) {
        if (strcmp(t->text, "_") == 0) {
            t->var = (*next)++;
            return 0;
        }
        for (size_t k = 0; k < v->n; k++)
            if (strcmp(v->names[k], t->text) == 0) {
                t->var = v->slots[k];
                return 0;
            }
        char **names = realloc(v->names, (v->n + 1) * sizeof *names);
        if (!names)
            return -1;
        v->names = names;
        int *slots = realloc(v->slots, (v->n + 1) * sizeof *slots);
        if (!slots)
            return -1;
        v->slots = slots;
        v->names[v->n] = t->text;
        v->slots[v->n] = t->var = (*next)++;
        v->n++;
        return 0;
    }
    for (size_t i = 0; i < t->arity; i++)
        if (number_vars(t->args[i], v, next))
            return -1;
    return 0;
}

static term *parse_text(const char *s, int *next)
{
    reader r = {.s = s, .n = strlen(s)};
    term *t = read_term(&r, 0);
    skip_ws(&r);
    if (t && r.i < r.n && r.s[r.i] == '.') {
        r.i++;
        skip_ws(&r);
    }
    if (!t || r.fail || r.i != r.n) {
        term_free(t);
        return NULL;
    }
    vars v = {0};
    int rc = number_vars(t, &v, next);
    free(v.names);
    free(v.slots);
    if (rc) {
        term_free(t);
        return NULL;
    }
    return t;
}

static term *deref(term *t, term **bind)
{
    while (t->kind == T_VAR && bind[t->var])
        t = bind[t->var];
    return t;
}

/* COD_MATCH_YES, _NO or _UNKNOWN (a string met a list: it depends on the double_quotes flag). */
static int unify(term *a, term *b, term **bind, int depth)
{
    a = deref(a, bind);
    b = deref(b, bind);
    if (depth > 1000)
        return COD_MATCH_UNKNOWN;
    if (a->kind == T_VAR) {
        if (!(b->kind == T_VAR && b->var == a->var))
            bind[a->var] = b;
        return COD_MATCH_YES;
    }
    if (b->kind == T_VAR) {
        bind[b->var] = a;
        return COD_MATCH_YES;
    }
    if ((a->kind == T_STR && (b->kind == T_NIL || (b->kind == T_COMP && strcmp(b->text, "[|]") == 0))) ||
        (b->kind == T_STR && (a->kind == T_NIL || (a->kind == T_COMP && strcmp(a->text, "[|]") == 0))))
        return COD_MATCH_UNKNOWN;
    if (a->kind != b->kind)
        return COD_MATCH_NO;
    switch (a->kind) {
    case T_NIL: return COD_MATCH_YES;
    case T_FLOAT: return a->f == b->f ? COD_MATCH_YES : COD_MATCH_NO;
    case T_ATOM:
    case T_INT:
    case T_STR: return a->len == b->len && memcmp(a->text, b->text, a->len) == 0 ? COD_MATCH_YES : COD_MATCH_NO;
    default: break;
    }
    if (a->arity != b->arity || a->len != b->len || memcmp(a->text, b->text, a->len) != 0)
        return COD_MATCH_NO;
    int verdict = COD_MATCH_YES;
    for (size_t i = 0; i < a->arity; i++) {
        int m = unify(a->args[i], b->args[i], bind, depth + 1);
        if (m == COD_MATCH_NO)
            return COD_MATCH_NO;
        if (m == COD_MATCH_UNKNOWN)
            verdict = COD_MATCH_UNKNOWN;
    }
    return verdict;
}

int cod_pattern_match(const char *pattern, const char *fact)
{
    if (strcmp(pattern, fact) == 0)
        return COD_MATCH_YES;
    int next = 0;
    term *p = parse_text(pattern, &next);
    term *f = p ? parse_text(fact, &next) : NULL;
    int verdict = COD_MATCH_UNKNOWN;
    if (p && f) {
        term **bind = calloc((size_t)next + 1, sizeof *bind);
        if (bind)
            verdict = unify(p, f, bind, 0);
        free(bind);
    }
    term_free(p);
    term_free(f);
    return verdict;
}
