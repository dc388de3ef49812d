/* Error codes and the errors a connection reports: per thread, as sentences. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- error codes ---- */

int cod_error_from_server(long long code)
{
    switch (code) {
    case -32700:
    case -32600: return COD_EREQUEST;
    case -32601: return COD_EMETHOD;
    case -32602: return COD_EPARAMS;
    case -32603: return COD_EINTERNAL;
    case -32000: return COD_EHELLO;
    case -32001: return COD_EVERSION;
    case -32010: return COD_EPERM;
    case -32020: return COD_ENOENT;
    case -32021: return COD_EEXIST;
    case -32030: return COD_EADMISSION;
    case -32040: return COD_ESYNTAX;
    case -32041: return COD_EUNSAFE;
    case -32042: return COD_EQUERYTIME;
    case -32053: return COD_ECANCELLED;
    case -32060: return COD_ESHUTDOWN;
    case -32070: return COD_EBUSY;
    case -32031:
    case -32052: return COD_EQUOTA;
    case -32071: return COD_ESLOW;
    case -32080: return COD_EUNKNOWN;
    default: return code <= -32043 && code >= -32051 ? COD_ESKB : COD_ESERVER;
    }
}

const char *cod_strerror(int code)
{
    switch (code) {
    case COD_OK: return "no error";
    case COD_EINVAL: return "invalid argument";
    case COD_ENOMEM: return "out of memory";
    case COD_ECONN: return "not connected to the daemon";
    case COD_ETIMEOUT: return "no reply in time";
    case COD_EPROTO: return "protocol error";
    case COD_ETOOBIG: return "request too large";
    case COD_ETYPE: return "value of another type";
    case COD_ERANGE: return "value out of range";
    case COD_EREPLAY: return "state not fully restored after reconnecting";
    case COD_EREQUEST: return "invalid request";
    case COD_EMETHOD: return "unknown method";
    case COD_EPARAMS: return "invalid parameters";
    case COD_EINTERNAL: return "internal error of the daemon";
    case COD_EHELLO: return "hello required first";
    case COD_EVERSION: return "unsupported protocol version";
    case COD_EPERM: return "permission denied";
    case COD_ENOENT: return "not found";
    case COD_EEXIST: return "already exists";
    case COD_EADMISSION: return "admission refused";
    case COD_ESKB: return "knowledge base error";
    case COD_ESYNTAX: return "syntax error";
    case COD_EUNSAFE: return "unsafe goal";
    case COD_EQUERYTIME: return "query time limit exceeded";
    case COD_ESHUTDOWN: return "daemon shutting down";
    case COD_EBUSY: return "daemon too busy";
    case COD_ESERVER: return "error reported by the daemon";
    case COD_EQUOTA: return "quota exceeded";
    case COD_ESLOW: return "too slow for the daemon";
    case COD_ECANCELLED: return "query cancelled";
    case COD_ESYSTEM: return "refused by the kernel";
    case COD_EUNKNOWN: return "outcome of the write unknown";
    default: return "unknown error";
    }
}

/* ---- per-thread errors ---- */

void cod_errrec_free(cod_errrec *e)
{
    free(e->msg);
    json_decref(e->data);
    free(e->unsettled_method);
    free(e->unsettled_params);
    free(e->unsettled_key);
    free(e);
}

cod_errrec *cod_errrec_of(cod_conn *c, int create)
{
    pthread_t me = pthread_self();
    for (cod_errrec *e = c->errs; e; e = e->next)
        if (pthread_equal(e->tid, me))
            return e;
    if (!create)
        return NULL;
    cod_errrec *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->tid = me;
    e->next = c->errs;
    c->errs = e;
    return e;
}

int cod_set_error(cod_conn *c, int code, long long server_code, json_t *data, const char *fmt, ...)
{
    cod_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && cod_buf_reserve(&b, (size_t)n) == 0) {
        va_start(ap, fmt);
        vsnprintf(b.p, (size_t)n + 1, fmt, ap);
        va_end(ap);
        b.len = (size_t)n;
    }
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 1);
    if (e) {
        free(e->msg);
        json_decref(e->data);
        e->code = code;
        e->server_code = server_code;
        e->msg = b.p;
        e->data = data;
        b.p = NULL;
        data = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(b.p);
    json_decref(data);
    return code;
}

void cod_clear_error(cod_conn *c)
{
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    if (e) {
        free(e->msg);
        json_decref(e->data);
        e->msg = NULL;
        e->data = NULL;
        e->code = 0;
        e->server_code = 0;
    }
    pthread_mutex_unlock(&c->mu);
}

const char *cod_errstr(const cod_conn *cc)
{
    if (!cc)
        return "no connection";
    cod_conn *c = (cod_conn *)cc;
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    const char *s = e && e->msg ? e->msg : e && e->code ? cod_strerror(e->code) : "no error";
    pthread_mutex_unlock(&c->mu);
    return s;
}

int cod_errcode(const cod_conn *cc)
{
    if (!cc)
        return COD_EINVAL;
    cod_conn *c = (cod_conn *)cc;
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    int code = e ? e->code : 0;
    pthread_mutex_unlock(&c->mu);
    return code;
}

long long cod_server_code(const cod_conn *cc)
{
    if (!cc)
        return 0;
    cod_conn *c = (cod_conn *)cc;
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    long long code = e ? e->server_code : 0;
    pthread_mutex_unlock(&c->mu);
    return code;
}

const cod_value *cod_server_data(const cod_conn *cc)
{
    if (!cc)
        return NULL;
    cod_conn *c = (cod_conn *)cc;
    pthread_mutex_lock(&c->mu);
    cod_errrec *e = cod_errrec_of(c, 0);
    json_t *d = e ? e->data : NULL;
    pthread_mutex_unlock(&c->mu);
    return (const cod_value *)d;
}

/* Why cod_connect failed, per thread (a key with a destructor: no leak when threads end). */
static pthread_key_t connect_err_key;
static pthread_once_t connect_err_once = PTHREAD_ONCE_INIT;
static void connect_err_init(void) { pthread_key_create(&connect_err_key, free); }

void cod_set_connect_error(const char *msg)
{
    pthread_once(&connect_err_once, connect_err_init);
    free(pthread_getspecific(connect_err_key));
    pthread_setspecific(connect_err_key, msg ? strdup(msg) : NULL);
}

const char *cod_connect_error(void)
{
    pthread_once(&connect_err_once, connect_err_init);
    const char *s = pthread_getspecific(connect_err_key);
    return s ? s : "no error";
}
