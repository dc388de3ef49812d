#include "plan.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void plan_free(struct plan *p)
{
    free(p->parts);
    free(p->moves);
    memset(p, 0, sizeof *p);
}

static size_t cur_tuples(const struct plan_part *cur, size_t ncur, int cpu, int *found)
{
    for (size_t i = 0; i < ncur; i++)
        if (cur[i].cpu == cpu) {
            if (found)
                *found = 1;
            return cur[i].tuples;
        }
    if (found)
        *found = 0;
    return 0;
}

static int distinct_cpus(const struct plan_part *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (parts[i].cpu == parts[j].cpu)
                return parts[i].cpu;
    return -1;
}

int plan_even(const struct plan_part *cur, size_t ncur, const int *cpus, size_t ncpus,
              struct plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (ncpus == 0) {
        snprintf(err, errlen, "a plan needs at least one core");
        return -1;
    }
    size_t total = 0;
    for (size_t i = 0; i < ncur; i++)
        total += cur[i].tuples;
    out->parts = calloc(ncpus, sizeof *out->parts);
    /* At most one move per (shrinking, growing) step of the greedy walk. */
    out->moves = calloc(ncur + ncpus, sizeof *out->moves);
    if (!out->parts || !out->moves) {
        plan_free(out);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    out->nparts = ncpus;
    for (size_t i = 0; i < ncpus; i++) {
        out->parts[i].cpu = cpus[i];
        out->parts[i].tuples = total / ncpus + (i < total % ncpus);
    }
    int dup = distinct_cpus(out->parts, ncpus);
    if (dup >= 0) {
        plan_free(out);
        snprintf(err, errlen, "CPU %d is listed twice", dup);
        return -1;
    }
    /* Walk the shrinking partitions (in cur order) and the growing ones
     * (in cpus order) side by side. */
    size_t si = 0, di = 0, s_left = 0, d_left = 0;
    for (;;) {
        while (s_left == 0 && si < ncur) {
            size_t tgt = 0;
            for (size_t k = 0; k < ncpus; k++)
                if (out->parts[k].cpu == cur[si].cpu)
                    tgt = out->parts[k].tuples;
            s_left = cur[si].tuples > tgt ? cur[si].tuples - tgt : 0;
            if (s_left == 0)
                si++;
        }
        while (d_left == 0 && di < ncpus) {
            size_t have = cur_tuples(cur, ncur, out->parts[di].cpu, NULL);
            d_left = out->parts[di].tuples > have ? out->parts[di].tuples - have : 0;
            if (d_left == 0)
                di++;
        }
        if (s_left == 0 || d_left == 0)
            break;
        size_t m = s_left < d_left ? s_left : d_left;
        out->moves[out->nmoves++] = (struct plan_move){ cur[si].cpu, out->parts[di].cpu, m };
        s_left -= m;
        d_left -= m;
        if (s_left == 0)
            si++;
        if (d_left == 0)
            di++;
    }
    return 0;
}

int plan_check(const struct plan_part *cur, size_t ncur, const struct plan *p,
               char *err, size_t errlen)
{
    if (p->nparts == 0) {
        snprintf(err, errlen, "the plan has no partitions");
        return -1;
    }
    int dup = distinct_cpus(p->parts, p->nparts);
    if (dup >= 0) {
        snprintf(err, errlen, "CPU %d has two partitions in the plan", dup);
        return -1;
    }
    for (size_t m = 0; m < p->nmoves; m++) {
        const struct plan_move *mv = &p->moves[m];
        int in_cur, in_new = 0;
        cur_tuples(cur, ncur, mv->from, &in_cur);
        for (size_t i = 0; i < p->nparts; i++)
            in_new |= p->parts[i].cpu == mv->to;
        if (!in_cur) {
            snprintf(err, errlen, "move %d>%d: CPU %d has no partition to take tuples from",
                     mv->from, mv->to, mv->from);
            return -1;
        }
        if (!in_new) {
            snprintf(err, errlen, "move %d>%d: CPU %d has no partition in the plan",
                     mv->from, mv->to, mv->to);
            return -1;
        }
        if (mv->from == mv->to || mv->tuples == 0) {
            snprintf(err, errlen, "move %d>%d:%zu moves nothing", mv->from, mv->to, mv->tuples);
            return -1;
        }
    }
    /* Every CPU, old or new: it ends with its size, and it either gives or
     * takes tuples, never both (a partition only shrinks from its tail or
     * only grows at it). */
    for (size_t pass = 0; pass < 2; pass++) {
        size_t n = pass ? p->nparts : ncur;
        for (size_t i = 0; i < n; i++) {
            int cpu = pass ? p->parts[i].cpu : cur[i].cpu;
            size_t have = cur_tuples(cur, ncur, cpu, NULL), want = 0, out = 0, in = 0;
            for (size_t k = 0; k < p->nparts; k++)
                if (p->parts[k].cpu == cpu)
                    want = p->parts[k].tuples;
            for (size_t m = 0; m < p->nmoves; m++) {
                const struct plan_move *mv = &p->moves[m];
                if ((mv->from == cpu && __builtin_add_overflow(out, mv->tuples, &out)) ||
                    (mv->to == cpu && __builtin_add_overflow(in, mv->tuples, &in))) {
                    snprintf(err, errlen, "CPU %d: tuple counts overflow", cpu);
                    return -1;
                }
            }
            if (out && in) {
                snprintf(err, errlen, "CPU %d both gives and takes tuples", cpu);
                return -1;
            }
            if (out > have) {
                snprintf(err, errlen, "CPU %d gives %zu tuples but holds %zu", cpu, out, have);
                return -1;
            }
            size_t end = have - out;
            if (__builtin_add_overflow(end, in, &end) || end != want) {
                snprintf(err, errlen, "CPU %d would hold %zu + %zu - %zu tuples, not the %zu the plan says",
                         cpu, have, in, out, want);
                return -1;
            }
        }
    }
    return 0;
}

static int parse_size(const char **s, size_t *v)
{
    char *end;
    if (**s < '0' || **s > '9')
        return -1;
    errno = 0;
    unsigned long long x = strtoull(*s, &end, 10);
    if (errno || x > SIZE_MAX / 2)
        return -1;
    *v = (size_t)x;
    *s = end;
    return 0;
}

static int parse_int(const char **s, int *v)
{
    size_t x;
    if (parse_size(s, &x) != 0 || x > 8191)
        return -1;
    *v = (int)x;
    return 0;
}

static void skip_spaces(const char **s)
{
    while (**s == ' ' || **s == '\t')
        (*s)++;
}

int plan_parse(const char *text, struct plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    for (const char *c = text; *c; c++)
        cap += *c == ',';
    cap += 2;
    out->parts = calloc(cap, sizeof *out->parts);
    out->moves = calloc(cap, sizeof *out->moves);
    if (!out->parts || !out->moves) {
        plan_free(out);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char *s = text;
    skip_spaces(&s);
    for (;;) {
        struct plan_part pp;
        if (parse_int(&s, &pp.cpu) != 0 || *s++ != ':' || parse_size(&s, &pp.tuples) != 0)
            goto bad;
        out->parts[out->nparts++] = pp;
        if (*s != ',')
            break;
        s++;
    }
    skip_spaces(&s);
    if (strncmp(s, "moves", 5) == 0) {
        s += 5;
        skip_spaces(&s);
        for (;;) {
            struct plan_move mv;
            if (parse_int(&s, &mv.from) != 0 || *s++ != '>' || parse_int(&s, &mv.to) != 0 ||
                *s++ != ':' || parse_size(&s, &mv.tuples) != 0)
                goto bad;
            out->moves[out->nmoves++] = mv;
            if (*s != ',')
                break;
            s++;
        }
        skip_spaces(&s);
    }
    if (*s == '\0' || *s == '\n')
        return 0;
bad:
    plan_free(out);
    snprintf(err, errlen, "bad plan '%s' (expected CPU:TUPLES[,...] [moves FROM>TO:TUPLES[,...]])", text);
    return -1;
}

int plan_format_parts(const struct plan_part *parts, size_t n, char *buf, size_t len)
{
    int total = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t used = (size_t)total < len ? (size_t)total : len;
        total += snprintf(buf + used, len - used, "%s%d:%zu", i ? "," : "", parts[i].cpu, parts[i].tuples);
    }
    return total;
}
