#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpulist.h"

struct schedule_item {
    int by_batch;
    uint64_t batch;
    double seconds;
    struct control_cmd cmd;
};

struct control {
    struct schedule_item *items;
    size_t nitems, next;
    int fd;            /* the FIFO, -1 if none */
    char buf[4096];    /* a partial line read from the FIFO */
    size_t buflen;
    int discarding;    /* the current line was too long: drop it */
};

void control_cmd_free(struct control_cmd *cmd)
{
    free(cmd->cpus);
    plan_free(&cmd->plan);
    memset(cmd, 0, sizeof *cmd);
}

int control_parse_what(const char *text, struct control_cmd *cmd, char *err, size_t errlen)
{
    memset(cmd, 0, sizeof *cmd);
    while (*text == ' ')
        text++;
    if (strncmp(text, "plan ", 5) == 0) {
        if (plan_parse(text + 5, &cmd->plan, err, errlen) != 0)
            return -1;
        cmd->kind = CONTROL_PLAN;
        return 0;
    }
    if (cpulist_parse(text, &cmd->cpus, &cmd->ncpus, err, errlen) != 0)
        return -1;
    cmd->kind = CONTROL_CORES;
    return 0;
}

static int parse_item(char *item, struct schedule_item *it, char *err, size_t errlen)
{
    char *eq = strchr(item, '=');
    if (!eq) {
        snprintf(err, errlen, "schedule item '%s' has no '=' (expected #N=CPUS or Ts=CPUS)", item);
        return -1;
    }
    *eq = '\0';
    char *when = item, *end;
    while (*when == ' ')
        when++;
    memset(it, 0, sizeof *it);
    errno = 0;
    if (when[0] == '#') {
        it->by_batch = 1;
        if (when[1] < '0' || when[1] > '9')
            goto bad_when;
        it->batch = strtoull(when + 1, &end, 10);
        if (errno || *end || it->batch == 0)
            goto bad_when;
    } else {
        it->seconds = strtod(when, &end);
        if (errno || end == when || strcmp(end, "s") != 0 || !(it->seconds >= 0))
            goto bad_when;
    }
    if (control_parse_what(eq + 1, &it->cmd, err, errlen) != 0)
        return -1;
    snprintf(it->cmd.source, sizeof it->cmd.source, "schedule %s=%s", when, eq + 1);
    return 0;
bad_when:
    snprintf(err, errlen, "schedule item '%s': expected #N (before batch N >= 1) or Ts (after T seconds)",
             when);
    return -1;
}

static int parse_schedule(struct control *c, const char *spec, char *err, size_t errlen)
{
    char *copy = strdup(spec), *save = NULL;
    if (!copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t cap = 1;
    for (const char *s = spec; *s; s++)
        cap += *s == ';';
    c->items = calloc(cap, sizeof *c->items);
    if (!c->items) {
        free(copy);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (char *item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save)) {
        if (parse_item(item, &c->items[c->nitems], err, errlen) != 0) {
            free(copy);
            return -1;
        }
        c->nitems++;
    }
    free(copy);
    if (c->nitems == 0) {
        snprintf(err, errlen, "empty --cores-schedule");
        return -1;
    }
    return 0;
}

int control_open(const char *schedule, const char *fifo_path, struct control **out,
                 char *err, size_t errlen)
{
    struct control *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->fd = -1;
    if (schedule && parse_schedule(c, schedule, err, errlen) != 0)
        goto fail;
    if (fifo_path) {
        /* Non-blocking: a FIFO opens for reading with no writer yet, and
         * reads never hold up a scan phase. */
        c->fd = open(fifo_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        if (c->fd < 0) {
            snprintf(err, errlen, "--control %s: %s", fifo_path, strerror(errno));
            goto fail;
        }
        if (fstat(c->fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
            snprintf(err, errlen, "--control %s: not a FIFO (make one with mkfifo)", fifo_path);
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    control_close(c);
    return -1;
}

/* One complete line from the FIFO into `line`, if there is one. */
static int fifo_line(struct control *c, char *line, size_t len)
{
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->buflen);
        if (nl) {
            size_t n = (size_t)(nl - c->buf);
            int drop = c->discarding;
            c->discarding = 0;
            if (!drop) {
                memcpy(line, c->buf, n < len - 1 ? n : len - 1);
                line[n < len - 1 ? n : len - 1] = '\0';
            }
            memmove(c->buf, nl + 1, c->buflen - n - 1);
            c->buflen -= n + 1;
            if (!drop)
                return 1;
            continue;
        }
        if (c->buflen == sizeof c->buf) { /* a line longer than the buffer */
            c->discarding = 1;
            c->buflen = 0;
        }
        ssize_t r = read(c->fd, c->buf + c->buflen, sizeof c->buf - c->buflen);
        if (r <= 0)
            return 0; /* nothing more now (EAGAIN), or no writer (0) */
        c->buflen += (size_t)r;
    }
}

int control_poll(struct control *c, uint64_t batch_no, double elapsed, struct control_cmd *cmd,
                 char *err, size_t errlen)
{
    memset(cmd, 0, sizeof *cmd);
    if (!c)
        return 0;
    if (c->next < c->nitems) {
        struct schedule_item *it = &c->items[c->next];
        if (it->by_batch ? batch_no >= it->batch : elapsed >= it->seconds) {
            *cmd = it->cmd;
            memset(&it->cmd, 0, sizeof it->cmd);
            c->next++;
            return 1;
        }
    }
    char line[sizeof c->buf];
    while (c->fd >= 0 && fifo_line(c, line, sizeof line)) {
        char *s = line;
        while (*s == ' ')
            s++;
        if (*s == '\0' || *s == '#')
            continue;
        int rc;
        if (strcmp(s, "stop") == 0) {
            cmd->kind = CONTROL_STOP;
            rc = 0;
        } else if (strncmp(s, "cores ", 6) == 0) {
            rc = control_parse_what(s + 6, cmd, err, errlen);
        } else if (strncmp(s, "plan ", 5) == 0) {
            rc = control_parse_what(s, cmd, err, errlen);
        } else {
            snprintf(err, errlen, "unknown control line '%.60s' (expected: cores LIST, plan ..., stop)", s);
            rc = -1;
        }
        if (rc != 0)
            return -1;
        snprintf(cmd->source, sizeof cmd->source, "control %.100s", s);
        return 1;
    }
    return 0;
}

void control_close(struct control *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nitems; i++)
        control_cmd_free(&c->items[i].cmd);
    free(c->items);
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}
