/* CPU lists in the Linux cpulist format ("0-3,8,10-11"). */
#ifndef CSCS_CPULIST_H
#define CSCS_CPULIST_H

#include <stddef.h>

/* Parse into an ascending list without duplicates (malloc'ed, *n entries).
 * Returns 0, or -1 with a message in err. */
int cpulist_parse(const char *text, int **cpus, size_t *n, char *err, size_t errlen);
/* Format ascending cpus compactly; returns the length (snprintf-like). */
int cpulist_format(const int *cpus, size_t n, char *buf, size_t len);
/* The CPUs this process may run on (sched_getaffinity), ascending. */
int cpulist_allowed(int **cpus, size_t *n);
int cpulist_contains(const int *cpus, size_t n, int cpu);

#endif
