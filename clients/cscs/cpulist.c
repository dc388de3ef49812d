#include "cpulist.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CPU 8191

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int parse_cpu(const char **s, int *cpu)
{
    char *end;
    if (**s < '0' || **s > '9')
        return -1;
    errno = 0;
    long v = strtol(*s, &end, 10);
    if (errno || v > MAX_CPU)
        return -1;
    *s = end;
    *cpu = (int)v;
    return 0;
}

int cpulist_parse(const char *text, int **cpus, size_t *n, char *err, size_t errlen)
{
    size_t cap = 16, cnt = 0;
    int *out = malloc(cap * sizeof *out);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char *s = text;
    while (*s) {
        int lo, hi;
        if (parse_cpu(&s, &lo) != 0)
            goto bad;
        hi = lo;
        if (*s == '-') {
            s++;
            if (parse_cpu(&s, &hi) != 0 || hi < lo)
                goto bad;
        }
        for (int c = lo; c <= hi; c++) {
            if (cnt == cap) {
                int *m = realloc(out, 2 * cap * sizeof *m);
                if (!m) {
                    free(out);
                    snprintf(err, errlen, "out of memory");
                    return -1;
                }
                out = m;
                cap *= 2;
            }
            out[cnt++] = c;
        }
        if (*s == ',' && s[1])
            s++;
        else if (*s)
            goto bad;
    }
    if (cnt == 0)
        goto bad;
    qsort(out, cnt, sizeof *out, cmp_int);
    size_t k = 0;
    for (size_t i = 0; i < cnt; i++)
        if (k == 0 || out[k - 1] != out[i])
            out[k++] = out[i];
    *cpus = out;
    *n = k;
    return 0;
bad:
    free(out);
    snprintf(err, errlen, "bad CPU list '%s' (expected e.g. 0-3,8 with CPU numbers up to %d)",
             text, MAX_CPU);
    return -1;
}

int cpulist_format(const int *cpus, size_t n, char *buf, size_t len)
{
    size_t used = 0;
    int total = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
            j++;
        int w;
        const char *sep = i ? "," : "";
        if (j == i)
            w = snprintf(buf + used, used < len ? len - used : 0, "%s%d", sep, cpus[i]);
        else
            w = snprintf(buf + used, used < len ? len - used : 0, "%s%d-%d", sep, cpus[i], cpus[j]);
        total += w;
        used = (size_t)total < len ? (size_t)total : len;
        i = j + 1;
    }
    return total;
}

int cpulist_allowed(int **cpus, size_t *n)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return -1;
    int cnt = CPU_COUNT(&set);
    int *out = malloc((size_t)(cnt ? cnt : 1) * sizeof *out);
    if (!out)
        return -1;
    size_t k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < (size_t)cnt; c++)
        if (CPU_ISSET(c, &set))
            out[k++] = c;
    *cpus = out;
    *n = k;
    return 0;
}

int cpulist_contains(const int *cpus, size_t n, int cpu)
{
    for (size_t i = 0; i < n; i++)
        if (cpus[i] == cpu)
            return 1;
    return 0;
}
