/* The connection: sockets, frames on the wire, calls and their timeouts, reconnection, and
 * the direct query channel to the SKB.  (errors.c reports errors; events.c queues upcalls
 * and runs the event loop's side.) */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_RECONNECT_MS 10000
#define DEFAULT_MAX_FRAME (1u << 20)
#define READ_CHUNK 65536
#define CLIENT_NAME "libcod/" COD_VERSION

double cod_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Milliseconds left before deadline (0: none) for poll(): -1 means wait forever. */
int cod_ms_left(double deadline)
{
    if (deadline <= 0)
        return -1;
    double left = deadline - cod_now();
    if (left <= 0)
        return 0;
    double ms = left * 1000.0 + 0.999;
    return ms > 2147483647.0 ? 2147483647 : (int)ms;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

/* ---- sockets ---- */

static char *default_socket_path(void)
{
    const char *env = getenv("COD_SOCKET");
    if (env && *env)
        return strdup(env);
    if (geteuid() == 0)
        return strdup("/run/cod/rm.sock");
    cod_buf b = {0};
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg)
        cod_buf_printf(&b, "%s/cod/rm.sock", xdg);
    else
        cod_buf_printf(&b, "/tmp/cod-%u/cod/rm.sock", (unsigned)geteuid());
    return cod_buf_take(&b);
}

/* Connects to a Unix socket; a path longer than sun_path goes through /proc/self/fd.
 * Returns the descriptor (non-blocking, close-on-exec) or -errno. */
static int dial(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    int dirfd = -1;
    size_t len = strlen(path);
    if (len < sizeof sa.sun_path) {
        memcpy(sa.sun_path, path, len);
    } else {
        const char *slash = strrchr(path, '/');
        char *dir = slash ? strndup(path, (size_t)(slash - path) + 1) : NULL;
        if (dir)
            dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        free(dir);
        int n = dirfd < 0 ? -1 : snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/%s", dirfd, slash + 1);
        if (n < 0 || (size_t)n >= sizeof sa.sun_path) {
            if (dirfd >= 0)
                close(dirfd);
            close(fd);
            return -ENAMETOOLONG;
        }
    }
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    while (rc < 0 && errno == EINTR);
    int err = errno;
    if (dirfd >= 0)
        close(dirfd);
    if (rc < 0) {
        close(fd);
        return -err;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    return fd;
}

static void chan_close(cod_chan *ch)
{
    if (ch->fd >= 0)
        close(ch->fd);
    ch->fd = -1;
    ch->wait_ms = COD_CHAN_NONBLOCKING;
    cod_reader_reset(&ch->rd);
}

/* The direct channel blocks in recv() and send() under the socket's own timeouts: one system
 * call per read where poll() + recv() took two (no event loop watches that socket). */
static int chan_set_blocking(cod_chan *ch)
{
    int fl = fcntl(ch->fd, F_GETFL);
    if (fl < 0 || fcntl(ch->fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
        return -1;
    ch->wait_ms = 0;
    return 0;
}

/* Bounds a blocking channel's next wait by ms (cod_ms_left: -1 no bound, > 0 ms left).  The
 * timeouts set before are kept while they differ from ms by at most 1/64 of it: so a call's
 * first wait, bounded by the connection's timeout as the last call's was, costs no system
 * call, and a wait overruns its deadline by at most ~1.6 %. */
static void chan_bound_wait(cod_chan *ch, int ms)
{
    int want = ms < 0 ? 0 : ms;
    int cur = ch->wait_ms;
    if (cur == want || (cur > 0 && want > 0 && abs(cur - want) <= want / 64))
        return;
    struct timeval tv = {want / 1000, (want % 1000) * 1000};
    if (setsockopt(ch->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
        setsockopt(ch->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0)
        ch->wait_ms = want;
}

static int send_all(cod_chan *ch, const char *p, size_t n, double deadline, int *sent)
{
    int fd = ch->fd;
    while (n) {
        if (ch->wait_ms != COD_CHAN_NONBLOCKING) {
            int ms = cod_ms_left(deadline);
            if (ms == 0)
                return COD_ETIMEOUT;
            chan_bound_wait(ch, ms);
        }
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            *sent = 1;
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfd = {fd, POLLOUT, 0};
            int ms = cod_ms_left(deadline);
            if (ms == 0)
                return COD_ETIMEOUT;
            int r = poll(&pfd, 1, ms);
            if (r == 0)
                return COD_ETIMEOUT;
            continue;
        }
        return COD_ECONN;
    }
    return 0;
}

/* Reads what the socket has (after waiting for it until deadline, if wait).  A blocking
 * channel waits in recv() itself; its timeout's EAGAIN comes back here to check the deadline. */
static int fill(cod_chan *ch, double deadline, int wait)
{
    int blocking = ch->wait_ms != COD_CHAN_NONBLOCKING;
    for (;;) {
        if (wait) {
            int ms = cod_ms_left(deadline);
            if (ms == 0)
                return COD_ETIMEOUT;
            if (blocking) {
                chan_bound_wait(ch, ms);
            } else {
                struct pollfd pfd = {ch->fd, POLLIN, 0};
                int r = poll(&pfd, 1, ms);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r == 0)
                    return COD_ETIMEOUT;
            }
        }
        size_t got;
        char *p = cod_reader_space(&ch->rd, READ_CHUNK, &got);
        if (!p)
            return COD_ENOMEM;
        ssize_t n = recv(ch->fd, p, got, wait ? 0 : MSG_DONTWAIT);
        if (n > 0) {
            cod_reader_wrote(&ch->rd, (size_t)n);
            return 0;
        }
        if (n == 0)
            return COD_ECONN;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!wait)
                return 1; /* nothing there */
            continue;
        }
        return COD_ECONN;
    }
}

/* ---- frames out ---- */

/* The frame of one request in c->out. */
static int build_request(cod_conn *c, long long id, const char *method, const char *params, size_t plen)
{
    cod_buf *o = &c->out;
    o->len = 0;
    if (cod_buf_reserve(o, plen + 96))
        return COD_ENOMEM;
    o->len = 4;
    if (cod_buf_printf(o, "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":", id))
        return COD_ENOMEM;
    int rc = cod_buf_json_string(o, method, strlen(method));
    if (rc)
        return rc;
    if (params && (cod_buf_puts(o, ",\"params\":") || cod_buf_append(o, params, plen)))
        return COD_ENOMEM;
    if (cod_buf_putc(o, '}'))
        return COD_ENOMEM;
    size_t body = o->len - 4;
    if (body > c->max_frame)
        return COD_ETOOBIG;
    unsigned char *h = (unsigned char *)o->p;
    h[0] = (unsigned char)(body >> 24);
    h[1] = (unsigned char)(body >> 16);
    h[2] = (unsigned char)(body >> 8);
    h[3] = (unsigned char)body;
    return 0;
}

/* ---- losing and finding the daemon ---- */

void cod_arm_retry(cod_conn *c, double delay)
{
    c->retry_at = cod_now() + delay;
    struct itimerspec ts;
    memset(&ts, 0, sizeof ts);
    ts.it_value.tv_sec = (time_t)delay;
    ts.it_value.tv_nsec = (long)((delay - (double)(time_t)delay) * 1e9);
    if (ts.it_value.tv_sec == 0 && ts.it_value.tv_nsec == 0)
        ts.it_value.tv_nsec = 1;
    timerfd_settime(c->tfd, 0, &ts, NULL);
}

static void disarm_retry(cod_conn *c)
{
    struct itimerspec ts;
    memset(&ts, 0, sizeof ts);
    timerfd_settime(c->tfd, 0, &ts, NULL);
    uint64_t n;
    ssize_t r = read(c->tfd, &n, sizeof n);
    (void)r;
}

/* The RM connection is gone: close both channels, tell the application, plan a retry. */
void cod_lose(cod_conn *c)
{
    if (c->lost)
        return;
    chan_close(&c->rm);
    chan_close(&c->skb);
    c->lost = 1;
    cod_queue_conn_event(c, "disconnected", json_object());
    if (c->reconnect_mode == COD_RECONNECT_AUTO) {
        c->retry_delay = 0.02;
        cod_arm_retry(c, 0);
    }
}

/* ---- one exchange ---- */

/* Waits on ch for the reply with this id; upcalls met on the way are queued. */
static int wait_reply(cod_conn *c, cod_chan *ch, long long id, double deadline, json_t **reply, char **why)
{
    for (;;) {
        cod_msg m;
        int rc;
        while ((rc = cod_reader_next(&ch->rd, &m)) != 0) {
            if (rc < 0) {
                *why = m.why;
                m.why = NULL;
                cod_msg_release(&m);
                return rc;
            }
            if (m.kind == COD_MSG_REPLY && ((m.has_id && m.id == id) || (!m.has_id && m.error))) {
                /* An error with a null id answers the request in flight: the daemon could not read it. */
                *reply = m.root;
                m.root = NULL;
                cod_msg_release(&m);
                return 0;
            }
            if (m.kind == COD_MSG_UPCALL && ch == &c->rm)
                cod_on_upcall(c, &m);
            cod_msg_release(&m); /* a late reply to a call that timed out, or a bad frame */
        }
        rc = fill(ch, deadline, 1);
        if (rc)
            return rc;
    }
}

/* Sends one request on ch and waits for its reply.  Transport failures return COD_ECONN,
 * COD_ETIMEOUT or COD_EPROTO with *why; nothing is recorded on the connection.  *sent says
 * whether any of the request reached the socket: 1 part of it, 2 all of it (the daemon may run it). */
static int exchange(cod_conn *c, cod_chan *ch, const char *method, const char *params, size_t plen,
                    json_t **reply, char **why, int *sent)
{
    *reply = NULL;
    *why = NULL;
    *sent = 0;
    if (ch->fd < 0)
        return COD_ECONN;
    long long id = c->next_id++;
    int rc = build_request(c, id, method, params, plen);
    if (rc)
        return rc;
    double deadline = c->timeout_ms > 0 ? cod_now() + c->timeout_ms / 1000.0 : 0;
    rc = send_all(ch, c->out.p, c->out.len, deadline, sent);
    if (c->out.cap > (4u << 20))
        cod_buf_free(&c->out); /* do not keep a huge buffer after a huge request */
    if (rc == COD_ETIMEOUT) {
        /* Half a frame is on the wire: the stream is unusable. */
        chan_close(ch);
        return COD_ETIMEOUT;
    }
    if (rc)
        return rc;
    *sent = 2;
    return wait_reply(c, ch, id, deadline, reply, why);
}

/* The outcome of a reply: 0, or the server's error recorded on the connection. */
static int outcome(cod_conn *c, const char *method, json_t *reply)
{
    json_t *err = json_object_get(reply, "error");
    if (!err)
        return 0;
    long long code = json_integer_value(json_object_get(err, "code"));
    const char *msg = json_string_value(json_object_get(err, "message"));
    json_t *data = json_object_get(err, "data");
    return cod_set_error(c, cod_error_from_server(code), code, data ? json_incref(data) : NULL,
                         "%s: %s (daemon error %lld)", method, msg ? msg : "no message", code);
}

static int transport_error(cod_conn *c, const char *method, int rc, const char *why)
{
    switch (rc) {
    case COD_ETIMEOUT:
        return cod_set_error(c, rc, 0, NULL, "%s: no reply from the daemon within %d ms", method, c->timeout_ms);
    case COD_ETOOBIG:
        return cod_set_error(c, rc, 0, NULL,
                             "%s: the request is %zu bytes, over the daemon's limit of %zu bytes (max_frame_bytes); "
                             "send it in parts",
                             method, c->out.len - 4, c->max_frame);
    case COD_EINVAL: return cod_set_error(c, rc, 0, NULL, "%s: a method name that is not UTF-8", method);
    case COD_ENOMEM: return cod_set_error(c, rc, 0, NULL, "%s: out of memory", method);
    case COD_EPROTO:
        return cod_set_error(c, rc, 0, NULL, "%s: %s", method, why ? why : "the daemon broke the protocol");
    default:
        return cod_set_error(c, COD_ECONN, 0, NULL, "%s: the connection to the daemon at %s was lost", method,
                             c->path);
    }
}

/* A write whose whole request left but whose reply did not come: it may have run. */
static int unknown_outcome(cod_conn *c, const char *method, int rc)
{
    return cod_set_error(c, COD_EUNKNOWN, 0, NULL,
                         "%s: %s; the write may or may not take effect (cod_retry sends it again with its "
                         "request key, cod_request_key)",
                         method, rc == COD_ETIMEOUT ? "no reply from the daemon in time"
                                                    : "the connection was lost after the request was sent");
}

static int roundtrip(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply, int write);

/* A call on the RM; c->io held. */
int cod_roundtrip_text(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply)
{
    return roundtrip(c, method, params, plen, reply, 0);
}

int cod_roundtrip_write(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply)
{
    return roundtrip(c, method, params, plen, reply, 1);
}

static int roundtrip(cod_conn *c, const char *method, const char *params, size_t plen, json_t **reply, int write)
{
    int rc = cod_ensure_connected(c);
    if (rc)
        return rc;
    char *why = NULL;
    int sent = 0;
    rc = exchange(c, &c->rm, method, params, plen, reply, &why, &sent);
    if (rc == COD_ECONN && !sent && c->reconnect_mode == COD_RECONNECT_AUTO) {
        /* The daemon went away before the request left: nothing ran, so after reconnecting
         * the request is sent again. */
        free(why);
        why = NULL;
        cod_lose(c);
        rc = cod_ensure_connected(c);
        if (rc)
            return rc;
        rc = exchange(c, &c->rm, method, params, plen, reply, &why, &sent);
    }
    if (rc) {
        if (rc == COD_ECONN || rc == COD_EPROTO || (rc == COD_ETIMEOUT && c->rm.fd < 0)) {
            cod_lose(c);
        }
        if (write && sent == 2 && (rc == COD_ECONN || rc == COD_ETIMEOUT || rc == COD_EPROTO))
            rc = unknown_outcome(c, method, rc);
        else
            rc = transport_error(c, method, rc, why);
        free(why);
        return rc;
    }
    rc = outcome(c, method, *reply);
    if (rc) {
        json_decref(*reply);
        *reply = NULL;
    }
    return rc;
}

int cod_roundtrip(cod_conn *c, const char *method, json_t *params, json_t **reply)
{
    cod_buf p = {0};
    *reply = NULL;
    if (params && cod_buf_dump_json(&p, params)) {
        json_decref(params);
        return cod_set_error(c, COD_ENOMEM, 0, NULL, "%s: out of memory", method);
    }
    json_decref(params);
    int rc = cod_roundtrip_text(c, method, p.p, p.len, reply);
    cod_buf_free(&p);
    return rc;
}

/* A query: on the direct channel when there is one, else (or when it fails) through the RM. */
int cod_roundtrip_query_text(cod_conn *c, const char *params, size_t plen, json_t **reply)
{
    *reply = NULL;
    int rc = cod_ensure_connected(c);
    if (rc)
        return rc;
    if (c->skb.fd >= 0) {
        char *why = NULL;
        int sent;
        rc = exchange(c, &c->skb, "execute_query", params, plen, reply, &why, &sent);
        free(why);
        if (rc == 0) {
            json_t *err = json_object_get(*reply, "error");
            if (!err || json_integer_value(json_object_get(err, "code")) != -32010) {
                rc = outcome(c, "execute_query", *reply);
                if (rc) {
                    json_decref(*reply);
                    *reply = NULL;
                }
                return rc;
            }
            json_decref(*reply); /* the capability was refused: use the RM until reconnecting */
            *reply = NULL;
        } else if (rc == COD_ETIMEOUT && c->skb.fd >= 0) {
            return transport_error(c, "execute_query", rc, NULL);
        }
        chan_close(&c->skb);
        c->direct_usable = 0;
    }
    return cod_roundtrip_text(c, "execute_query", params, plen, reply);
}

int cod_roundtrip_query(cod_conn *c, json_t *params, json_t **reply)
{
    cod_buf p = {0};
    *reply = NULL;
    int rc = cod_buf_dump_json(&p, params);
    json_decref(params);
    rc = rc ? cod_set_error(c, COD_ENOMEM, 0, NULL, "execute_query: out of memory")
            : cod_roundtrip_query_text(c, p.p, p.len, reply);
    cod_buf_free(&p);
    return rc;
}

/* ---- sessions ---- */

/* Opens the direct channel the daemon offers in its hello, if any; failures are silent:
 * queries then go through the RM. */
static void open_direct(cod_conn *c)
{
    chan_close(&c->skb);
    json_t *skb = json_object_get(c->hello, "skb");
    if (!c->direct_enabled || !c->direct_usable || !json_is_object(skb))
        return;
    const char *path = json_string_value(json_object_get(skb, "socket"));
    const char *token = json_string_value(json_object_get(skb, "token"));
    if (!path || !token || json_integer_value(json_object_get(skb, "protocol")) != 1)
        return;
    int fd = dial(path);
    if (fd < 0)
        return;
    c->skb.fd = fd;
    if (chan_set_blocking(&c->skb)) {
        chan_close(&c->skb);
        return;
    }
    json_t *params = json_pack("{s:i, s:s}", "version", COD_PROTOCOL_VERSION, "token", token);
    cod_buf p = {0};
    json_t *reply = NULL;
    char *why = NULL;
    int sent;
    int rc = params && !cod_buf_dump_json(&p, params) ? exchange(c, &c->skb, "hello", p.p, p.len, &reply, &why, &sent)
                                                     : COD_ENOMEM;
    if (rc || !json_is_object(json_object_get(reply, "result")))
        chan_close(&c->skb);
    json_decref(params);
    json_decref(reply);
    cod_buf_free(&p);
    free(why);
}

/* Connects and says hello: 0, or a code with *why (malloc'd); *fatal when retrying cannot help. */
static int open_session(cod_conn *c, char **why, int *fatal)
{
    *why = NULL;
    *fatal = 0;
    chan_close(&c->rm);
    chan_close(&c->skb);
    int fd = dial(c->path);
    cod_buf m = {0};
    if (fd < 0) {
        cod_buf_printf(&m, "no COD daemon answers on %s: %s", c->path, strerror(-fd));
        *why = cod_buf_take(&m);
        errno = -fd;
        return COD_ECONN;
    }
    c->rm.fd = fd;
    json_t *params = json_pack("{s:i, s:s}", "version", COD_PROTOCOL_VERSION, "client", CLIENT_NAME);
    if (params && c->app)
        json_object_set_new(params, "app", json_string(c->app));
    cod_buf p = {0};
    json_t *reply = NULL;
    char *twhy = NULL;
    int sent;
    size_t saved_max = c->max_frame;
    c->max_frame = DEFAULT_MAX_FRAME;
    int rc = params && !cod_buf_dump_json(&p, params) ? exchange(c, &c->rm, "hello", p.p, p.len, &reply, &twhy, &sent)
                                                     : COD_ENOMEM;
    c->max_frame = saved_max;
    json_decref(params);
    cod_buf_free(&p);
    json_t *result = json_object_get(reply, "result");
    json_t *err = json_object_get(reply, "error");
    if (rc == 0 && err) {
        long long code = json_integer_value(json_object_get(err, "code"));
        cod_buf_printf(&m, "the daemon on %s refused hello: %s (daemon error %lld)", c->path,
                       json_string_value(json_object_get(err, "message")), code);
        rc = cod_error_from_server(code);
        *fatal = 1;
        errno = rc == COD_EPERM ? EACCES : rc == COD_EVERSION ? EPROTO : EINVAL;
    } else if (rc == 0 && (!json_is_object(result) || !json_is_string(json_object_get(result, "app")))) {
        cod_buf_printf(&m, "the daemon on %s answered hello without an application name", c->path);
        rc = COD_EPROTO;
        *fatal = 1;
        errno = EPROTO;
    } else if (rc) {
        cod_buf_printf(&m, "hello to %s failed: %s", c->path,
                       twhy ? twhy : rc == COD_ETIMEOUT ? "no reply in time" : "the connection closed");
        errno = rc == COD_ETIMEOUT ? ETIMEDOUT : rc == COD_EPROTO ? EPROTO : ECONNRESET;
    }
    free(twhy);
    if (rc) {
        json_decref(reply);
        chan_close(&c->rm);
        *why = cod_buf_take(&m);
        return rc;
    }
    const char *app = json_string_value(json_object_get(result, "app"));
    if (!c->app || strcmp(c->app, app) != 0) {
        char *dup = strdup(app);
        if (dup) {
            free(c->app);
            c->app = dup;
        }
    }
    json_decref(c->hello);
    c->hello = json_incref(result);
    json_decref(reply);
    json_t *mf = json_object_get(result, "max_frame_bytes");
    c->max_frame = json_is_integer(mf) && json_integer_value(mf) > 0 ? (size_t)json_integer_value(mf) : DEFAULT_MAX_FRAME;
    c->rm.rd.max_frame = c->max_frame;
    c->skb.rd.max_frame = c->max_frame;
    struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = fd}};
    epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &ev);
    c->direct_usable = 1;
    open_direct(c);
    return 0;
}

int cod_reconnect_locked(cod_conn *c, int wait_ms)
{
    double deadline = cod_now() + (wait_ms > 0 ? wait_ms / 1000.0 : 0);
    double delay = 0.02;
    c->lost = 1; /* until the session is open again */
    chan_close(&c->rm);
    chan_close(&c->skb);
    for (;;) {
        char *why = NULL;
        int fatal = 0;
        int rc = open_session(c, &why, &fatal);
        if (rc == 0)
            break;
        if (fatal || cod_now() + delay > deadline) {
            rc = cod_set_error(c, fatal ? rc : COD_ECONN, 0, NULL, "reconnecting: %s", why);
            free(why);
            if (c->reconnect_mode == COD_RECONNECT_AUTO)
                cod_arm_retry(c, c->retry_delay > 0 ? c->retry_delay : 0.5);
            return rc;
        }
        free(why);
        sleep_s(delay);
        delay = delay * 2 < 0.5 ? delay * 2 : 0.5;
    }
    c->lost = 0;
    disarm_retry(c);
    int failures = cod_state_replay(c);
    if (failures < 0)
        return failures; /* lost again during the replay */
    cod_queue_conn_event(c, "reconnected", json_pack("{s:i}", "replay_errors", failures));
    return failures ? COD_EREPLAY : 0;
}

int cod_ensure_connected(cod_conn *c)
{
    if (!c->lost)
        return 0;
    if (c->reconnect_mode == COD_RECONNECT_AUTO) {
        int rc = cod_reconnect_locked(c, c->reconnect_timeout_ms);
        return rc == COD_EREPLAY ? 0 : rc;
    }
    return cod_set_error(c, COD_ECONN, 0, NULL,
                         "not connected: the connection to the daemon at %s was lost (cod_reconnect reconnects)",
                         c->path);
}

/* ---- the public connection calls ---- */

static cod_conn *conn_new(const char *path, const char *app)
{
    cod_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->io, NULL);
    pthread_mutex_init(&c->mu, NULL);
    c->rm.fd = c->skb.fd = -1;
    c->rm.wait_ms = c->skb.wait_ms = COD_CHAN_NONBLOCKING;
    c->epfd = c->evfd = c->tfd = -1;
    c->next_id = 1;
    c->next_sub = 1;
    c->timeout_ms = DEFAULT_TIMEOUT_MS;
    c->reconnect_timeout_ms = DEFAULT_RECONNECT_MS;
    c->direct_enabled = 1;
    c->max_frame = DEFAULT_MAX_FRAME;
    cod_reader_init(&c->rm.rd, DEFAULT_MAX_FRAME);
    cod_reader_init(&c->skb.rd, DEFAULT_MAX_FRAME);
    c->path = path ? strdup(path) : default_socket_path();
    c->app = app ? strdup(app) : NULL;
    c->allocs = json_object();
    c->facts[0] = json_object();
    c->facts[1] = json_object();
    c->procs = json_array();
    c->tasks = json_object();
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    c->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (!c->path || (app && !c->app) || !c->allocs || !c->facts[0] || !c->facts[1] || !c->procs || !c->tasks ||
        c->epfd < 0 || c->evfd < 0 || c->tfd < 0) {
        cod_free(c);
        return NULL;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = c->evfd}};
    epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->evfd, &ev);
    ev.data.fd = c->tfd;
    epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->tfd, &ev);
    return c;
}

cod_conn *cod_connect(const char *socket_path, const char *app)
{
    cod_conn *c = conn_new(socket_path, app);
    if (!c) {
        cod_set_connect_error("out of memory or descriptors");
        errno = errno ? errno : ENOMEM;
        return NULL;
    }
    char *why = NULL;
    int fatal;
    pthread_mutex_lock(&c->io);
    int rc = open_session(c, &why, &fatal);
    pthread_mutex_unlock(&c->io);
    if (rc) {
        int err = errno;
        cod_set_connect_error(why);
        free(why);
        cod_free(c);
        errno = err;
        return NULL;
    }
    cod_set_connect_error(NULL);
    return c;
}

void cod_free(cod_conn *c)
{
    if (!c)
        return;
    chan_close(&c->rm);
    chan_close(&c->skb);
    cod_reader_release(&c->rm.rd);
    cod_reader_release(&c->skb.rd);
    if (c->epfd >= 0)
        close(c->epfd);
    if (c->evfd >= 0)
        close(c->evfd);
    if (c->tfd >= 0)
        close(c->tfd);
    while (c->qhead) {
        cod_qevent *e = c->qhead;
        c->qhead = e->next;
        free(e->name);
        json_decref(e->params);
        free(e);
    }
    while (c->errs) {
        cod_errrec *e = c->errs;
        c->errs = e->next;
        cod_errrec_free(e);
    }
    cod_state_free(c);
    json_decref(c->allocs);
    json_decref(c->hello);
    cod_buf_free(&c->out);
    free(c->path);
    free(c->app);
    pthread_mutex_destroy(&c->io);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

const char *cod_app(const cod_conn *c) { return c ? c->app : NULL; }

int cod_set_timeout(cod_conn *c, int timeout_ms)
{
    if (!c)
        return COD_EINVAL;
    pthread_mutex_lock(&c->io);
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    pthread_mutex_unlock(&c->io);
    return 0;
}

int cod_set_reconnect(cod_conn *c, int mode, int timeout_ms)
{
    if (!c || (mode != COD_RECONNECT_MANUAL && mode != COD_RECONNECT_AUTO))
        return COD_EINVAL;
    pthread_mutex_lock(&c->io);
    c->reconnect_mode = mode;
    c->reconnect_timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    if (mode == COD_RECONNECT_AUTO && c->lost)
        cod_arm_retry(c, 0);
    pthread_mutex_unlock(&c->io);
    return 0;
}

int cod_reconnect(cod_conn *c)
{
    if (!c)
        return COD_EINVAL;
    pthread_mutex_lock(&c->io);
    int rc = cod_reconnect_locked(c, c->reconnect_timeout_ms);
    pthread_mutex_unlock(&c->io);
    return rc;
}

int cod_is_connected(const cod_conn *c) { return c && !c->lost && c->rm.fd >= 0; }

int cod_set_direct(cod_conn *c, int enabled)
{
    if (!c)
        return COD_EINVAL;
    pthread_mutex_lock(&c->io);
    c->direct_enabled = enabled != 0;
    if (!enabled) {
        chan_close(&c->skb);
    } else if (c->skb.fd < 0 && !c->lost) {
        c->direct_usable = 1; /* asked for: try again now */
        open_direct(c);
    }
    pthread_mutex_unlock(&c->io);
    return 0;
}

int cod_is_direct(const cod_conn *c) { return c && c->skb.fd >= 0; }

cod_reply *cod_server_info(cod_conn *c)
{
    if (!c)
        return NULL;
    pthread_mutex_lock(&c->io);
    json_t *root = json_pack("{s:O?}", "result", c->hello);
    pthread_mutex_unlock(&c->io);
    if (!root) {
        cod_set_error(c, COD_ENOMEM, 0, NULL, "cod_server_info: out of memory");
        return NULL;
    }
    return cod_reply_wrap(root);
}

/* Reads what the RM sent, without waiting; c->io held.  A bounded number of reads, so one
 * dispatch cannot be kept busy forever by a flood: the descriptor stays readable. */
int cod_pump(cod_conn *c)
{
    if (c->rm.fd < 0)
        return 0;
    for (int reads = 0; reads < 64; reads++) {
        cod_msg m;
        int rc;
        while ((rc = cod_reader_next(&c->rm.rd, &m)) != 0) {
            if (rc < 0) {
                cod_set_error(c, COD_EPROTO, 0, NULL, "%s", m.why);
                cod_msg_release(&m);
                cod_lose(c);
                return COD_EPROTO;
            }
            if (m.kind == COD_MSG_UPCALL)
                cod_on_upcall(c, &m);
            cod_msg_release(&m);
        }
        rc = fill(&c->rm, 0, 0);
        if (rc == 1)
            return 0;
        if (rc == COD_ENOMEM)
            return cod_set_error(c, rc, 0, NULL, "reading upcalls: out of memory");
        if (rc) {
            cod_lose(c);
            return 0;
        }
    }
    return 0;
}
