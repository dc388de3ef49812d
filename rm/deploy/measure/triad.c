/* A STREAM-like triad measuring a NUMA node's attainable memory bandwidth.
 *
 *   triad CPULIST NODE THREADS ELEMENTS ITERATIONS
 *
 * CPULIST: the CPUs to run on ("0-5,12"), threads pinned round-robin to them.
 * NODE: the NUMA node the three arrays are bound to (mbind MPOL_BIND before the
 * first touch), or -1 to leave placement to the kernel (a one-node machine, or
 * a kernel without NUMA).  Each thread first touches its own slice, then every
 * iteration runs a[i] = b[i] + s * c[i] over its slice between two barriers.
 * Counted as STREAM does: 24 bytes per element and iteration (two loads, one
 * store; the write-allocate read is not counted).  Prints one JSON object:
 * the best and mean bandwidth over the iterations after the first, and
 * whether the result checked.  Exit status 2 on bad arguments, 1 on failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MPOL_BIND 2
#define MAX_CPUS 4096

struct shared {
    double *a, *b, *c;
    size_t n;
    int threads;
    int iterations;
    int cpus[MAX_CPUS];
    int ncpus;
    pthread_barrier_t barrier;
    double *times; /* per iteration, measured by thread 0 */
    int pin_failed;
};

struct worker {
    struct shared *sh;
    int id;
    pthread_t thread;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_cpulist(const char *text, int *out, int max) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long lo = strtol(p, &end, 10);
        if (end == p || lo < 0 || lo >= MAX_CPUS) return -1;
        long hi = lo;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo || hi >= MAX_CPUS) return -1;
            p = end;
        }
        for (long c = lo; c <= hi; c++) {
            if (n >= max) return -1;
            out[n++] = (int)c;
        }
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

static void *run(void *arg) {
    struct worker *w = arg;
    struct shared *sh = w->sh;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sh->cpus[w->id % sh->ncpus], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) __atomic_store_n(&sh->pin_failed, 1, __ATOMIC_RELAXED);
    size_t chunk = (sh->n + (size_t)sh->threads - 1) / (size_t)sh->threads;
    size_t lo = chunk * (size_t)w->id;
    size_t hi = lo + chunk > sh->n ? sh->n : lo + chunk;
    if (lo > hi) lo = hi;
    double *a = sh->a, *b = sh->b, *c = sh->c;
    for (size_t i = lo; i < hi; i++) { /* first touch: pages land on the bound node */
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    const double s = 3.0;
    for (int it = 0; it < sh->iterations; it++) {
        pthread_barrier_wait(&sh->barrier);
        double t0 = now();
        for (size_t i = lo; i < hi; i++) a[i] = b[i] + s * c[i];
        pthread_barrier_wait(&sh->barrier);
        if (w->id == 0) sh->times[it] = now() - t0;
    }
    return NULL;
}

static double *map_array(size_t n, int node) {
    size_t bytes = n * sizeof(double);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (node >= 0) {
        unsigned long mask[MAX_CPUS / (8 * sizeof(unsigned long))];
        memset(mask, 0, sizeof mask);
        mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
        if (syscall(SYS_mbind, p, bytes, MPOL_BIND, mask, (unsigned long)MAX_CPUS, 0UL) != 0) {
            int err = errno;
            munmap(p, bytes);
            errno = err;
            return NULL;
        }
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s CPULIST NODE THREADS ELEMENTS ITERATIONS\n", argv[0]);
        return 2;
    }
    struct shared *sh = calloc(1, sizeof *sh);
    if (!sh) return 1;
    sh->ncpus = parse_cpulist(argv[1], sh->cpus, MAX_CPUS);
    char *end;
    long node = strtol(argv[2], &end, 10);
    int bad = sh->ncpus <= 0 || *end || node < -1 || node >= MAX_CPUS;
    long threads = strtol(argv[3], &end, 10);
    bad |= *end || threads < 1 || threads > 1024;
    long long elements = strtoll(argv[4], &end, 10);
    bad |= *end || elements < threads || elements > (1LL << 40);
    long iterations = strtol(argv[5], &end, 10);
    bad |= *end || iterations < 2 || iterations > 100000;
    if (bad) {
        fprintf(stderr, "triad: bad arguments (CPULIST NODE>=-1 THREADS>=1 ELEMENTS>=THREADS ITERATIONS>=2)\n");
        free(sh);
        return 2;
    }
    sh->n = (size_t)elements;
    sh->threads = (int)threads;
    sh->iterations = (int)iterations;
    sh->times = calloc((size_t)iterations, sizeof(double));
    sh->a = map_array(sh->n, (int)node);
    sh->b = sh->a ? map_array(sh->n, (int)node) : NULL;
    sh->c = sh->b ? map_array(sh->n, (int)node) : NULL;
    int status = 1;
    struct worker *ws = calloc((size_t)threads, sizeof *ws);
    if (!sh->times || !sh->c || !ws) {
        fprintf(stderr, "triad: cannot allocate 3 x %lld doubles on node %ld: %s\n", elements, node, strerror(errno));
        goto out;
    }
    pthread_barrier_init(&sh->barrier, NULL, (unsigned)threads);
    int started = 0;
    for (; started < threads; started++) {
        ws[started].sh = sh;
        ws[started].id = started;
        if (pthread_create(&ws[started].thread, NULL, run, &ws[started]) != 0) break;
    }
    if (started < threads) {
        /* Cannot happen with a sane thread limit; the started threads would wait forever. */
        fprintf(stderr, "triad: cannot start %ld threads\n", threads);
        _exit(1);
    }
    for (int i = 0; i < started; i++) pthread_join(ws[i].thread, NULL);
    pthread_barrier_destroy(&sh->barrier);
    int ok = 1;
    for (size_t i = 0; i < sh->n; i += 4099) ok &= sh->a[i] == 7.0;
    ok &= sh->a[sh->n - 1] == 7.0;
    double best = 1e300, sum = 0.0;
    for (int it = 1; it < sh->iterations; it++) { /* the first iteration warms up */
        if (sh->times[it] < best) best = sh->times[it];
        sum += sh->times[it];
    }
    double bytes = 24.0 * (double)sh->n;
    double mean = sum / (double)(sh->iterations - 1);
    printf("{\"node\": %ld, \"threads\": %ld, \"cpus\": \"%s\", \"elements\": %lld, \"iterations\": %ld, "
           "\"bytes_per_iteration\": %.0f, \"best_s\": %.9f, \"mean_s\": %.9f, "
           "\"bandwidth_bytes_per_s\": %.0f, \"mean_bandwidth_bytes_per_s\": %.0f, "
           "\"pinned\": %s, \"checked\": %s}\n",
           node, threads, argv[1], elements, iterations, bytes, best, mean, bytes / best, bytes / mean,
           sh->pin_failed ? "false" : "true", ok ? "true" : "false");
    status = ok ? 0 : 1;
out:
    if (sh->a) munmap(sh->a, sh->n * sizeof(double));
    if (sh->b) munmap(sh->b, sh->n * sizeof(double));
    if (sh->c) munmap(sh->c, sh->n * sizeof(double));
    free(sh->times);
    free(ws);
    free(sh);
    return status;
}
