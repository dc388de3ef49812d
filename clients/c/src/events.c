/* Upcalls: routed to their subscription's handler through a queue; run by cod_dispatch or
 * cod_wait_event in the application's thread, never inside another call. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* ---- events ---- */

static void signal_events(cod_conn *c)
{
    uint64_t one = 1;
    ssize_t n = write(c->evfd, &one, sizeof one);
    (void)n;
}

void cod_queue_event(cod_conn *c, int kind, int sub, const char *name, json_t *params)
{
    cod_qevent *e = calloc(1, sizeof *e);
    if (!e)
        return;
    e->kind = kind;
    e->sub = sub;
    e->name = strdup(name);
    e->params = params ? json_incref(params) : json_object();
    if (!e->name || !e->params) {
        free(e->name);
        json_decref(e->params);
        free(e);
        return;
    }
    pthread_mutex_lock(&c->mu);
    int was_empty = c->qhead == NULL;
    if (c->qtail)
        c->qtail->next = e;
    else
        c->qhead = e;
    c->qtail = e;
    if (was_empty)
        signal_events(c);
    pthread_mutex_unlock(&c->mu);
}

void cod_queue_conn_event(cod_conn *c, const char *name, json_t *params)
{
    if (c->conn_fn)
        cod_queue_event(c, 0, 0, name, params);
    json_decref(params);
}

/* An upcall read from the RM: remember allocations, queue it for its handler. */
void cod_on_upcall(cod_conn *c, cod_msg *m)
{
    const char *name = m->method;
    json_t *params = m->params;
    if (strcmp(name, "shutdown") == 0) {
        cod_queue_conn_event(c, "shutdown", json_incref(params));
        return;
    }
    const char *task = json_string_value(json_object_get(params, "task"));
    int is_alloc = strcmp(name, "allocation_changed") == 0 && task;
    json_t *sid = json_object_get(params, "subscription");
    cod_sub *sub = json_is_integer(sid) ? cod_sub_find_server(c, json_integer_value(sid)) : NULL;
    cod_sub *tsub = !sub && is_alloc ? cod_sub_find_task(c, task) : NULL;
    /* Handlers see the local subscription id (0 for a task's own upcalls). */
    json_object_set_new(params, "subscription", json_integer(sub ? sub->id : 0));
    if (is_alloc) {
        pthread_mutex_lock(&c->mu);
        json_t *old = json_object_get(c->allocs, task);
        if (!old || json_integer_value(json_object_get(params, "epoch")) >= json_integer_value(json_object_get(old, "epoch")))
            json_object_set(c->allocs, task, params);
        pthread_mutex_unlock(&c->mu);
    }
    if (sub && sub->fn)
        cod_queue_event(c, COD_SUB_EVENT, sub->id, name, params);
    else if (tsub && tsub->fn)
        cod_queue_event(c, COD_SUB_TASK, 0, name, params);
}

/* ---- event loop ---- */

int cod_fd(const cod_conn *c) { return c ? c->epfd : -1; }

int cod_on_connection(cod_conn *c, cod_event_fn fn, void *userdata)
{
    if (!c)
        return COD_EINVAL;
    pthread_mutex_lock(&c->io);
    pthread_mutex_lock(&c->mu);
    c->conn_fn = fn;
    c->conn_ud = userdata;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->io);
    return 0;
}

/* Runs the handlers of the events queued when it starts; returns how many ran. */
static int run_events(cod_conn *c)
{
    pthread_mutex_lock(&c->mu);
    cod_qevent *list = c->qhead;
    c->qhead = c->qtail = NULL;
    uint64_t n;
    ssize_t r = read(c->evfd, &n, sizeof n);
    (void)r;
    pthread_mutex_unlock(&c->mu);
    int ran = 0;
    while (list) {
        cod_qevent *e = list;
        list = e->next;
        cod_event_fn fn = NULL;
        void *ud = NULL;
        pthread_mutex_lock(&c->mu);
        if (e->kind == 0) {
            fn = c->conn_fn;
            ud = c->conn_ud;
        } else {
            for (cod_sub *s = c->subs; s; s = s->next) {
                if ((e->kind == COD_SUB_EVENT && s->kind == COD_SUB_EVENT && s->id == e->sub) ||
                    (e->kind == COD_SUB_TASK && s->kind == COD_SUB_TASK &&
                     strcmp(s->task, json_string_value(json_object_get(e->params, "task"))) == 0)) {
                    fn = s->fn;
                    ud = s->ud;
                    break;
                }
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (fn) {
            struct cod_event ev = {e->name, e->sub, e->params};
            fn(c, &ev, ud);
            ran++;
        }
        free(e->name);
        json_decref(e->params);
        free(e);
    }
    return ran;
}

int cod_dispatch(cod_conn *c)
{
    if (!c)
        return COD_EINVAL;
    int rc = 0, lost = 0, manual = 0;
    if (pthread_mutex_trylock(&c->io) == 0) {
        rc = cod_pump(c);
        if (c->lost && c->reconnect_mode == COD_RECONNECT_AUTO) {
            uint64_t n;
            ssize_t r = read(c->tfd, &n, sizeof n);
            (void)r;
            if (cod_now() >= c->retry_at) {
                /* One attempt, without waiting; on failure the timer brings the loop back
                 * for the next one, backing off to every 0.5 s. */
                c->retry_delay = c->retry_delay > 0 ? (c->retry_delay * 2 < 0.5 ? c->retry_delay * 2 : 0.5) : 0.02;
                cod_reconnect_locked(c, 0);
            } else {
                cod_arm_retry(c, c->retry_at - cod_now());
            }
        }
        lost = c->lost;
        manual = c->reconnect_mode == COD_RECONNECT_MANUAL;
        pthread_mutex_unlock(&c->io);
    }
    int ran = run_events(c);
    if (ran)
        return ran;
    if (lost && manual)
        return cod_set_error(c, COD_ECONN, 0, NULL,
                             "the connection to the daemon at %s was lost (cod_reconnect reconnects)", c->path);
    return rc < 0 ? rc : 0;
}

int cod_wait_event(cod_conn *c, int timeout_ms)
{
    if (!c)
        return COD_EINVAL;
    double deadline = timeout_ms >= 0 ? cod_now() + timeout_ms / 1000.0 : 0;
    for (;;) {
        int busy = pthread_mutex_trylock(&c->io);
        if (busy == 0)
            pthread_mutex_unlock(&c->io);
        int n = cod_dispatch(c);
        if (n != 0)
            return n;
        int ms = timeout_ms >= 0 ? cod_ms_left(deadline) : -1;
        if (timeout_ms >= 0 && ms == 0)
            return 0;
        /* While another thread is in a call it reads the socket: wait for the queue only. */
        struct pollfd pfd = {busy ? c->evfd : c->epfd, POLLIN, 0};
        int slice = busy ? 10 : ms;
        if (ms >= 0 && slice > ms)
            slice = ms;
        if (poll(&pfd, 1, slice) < 0 && errno != EINTR)
            return cod_set_error(c, COD_ECONN, 0, NULL, "cod_wait_event: poll failed: %s", strerror(errno));
    }
}
