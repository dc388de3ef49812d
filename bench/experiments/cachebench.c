/* The cache experiment's workers (bench/experiments/exp5_cache.py).
 *
 *   cachebench probe  TABLE_BYTES SECONDS   hash-join-like probe: dependent lookups into a hash
 *                                           table of TABLE_BYTES (16-byte buckets), the next
 *                                           bucket from the value found (a probe chain);
 *   cachebench random ARRAY_BYTES SECONDS   index-join-like: independent random 8-byte reads over
 *                                           ARRAY_BYTES, each line touched about once (weak);
 *   cachebench stream ARRAY_BYTES SECONDS   a scan: sequential reads over ARRAY_BYTES (weak).
 *
 * Each runs on the CPU it was started on (the driver pins it) for SECONDS after its data are
 * built, then prints one JSON line: {"mode":..., "bytes":..., "ops":..., "seconds":..., "ns_per_op":...},
 * "seconds" being the thread's CPU time (on a shared machine, time it spent descheduled is not
 * counted; what others did to the cache meanwhile is).
 * SECONDS 0 runs until SIGTERM (a co-runner), and prints "ready" once its data are built.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop;

static void on_term(int sig) {
    (void)sig;
    stop = 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_now(void) { /* this thread's CPU time: time descheduled on a busy machine not counted */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

struct bucket {
    uint64_t key;
    uint64_t value;
};

static size_t pow2_below(size_t n) {
    size_t p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

static void ready(double seconds) {
    if (seconds <= 0) { /* a co-runner: tell the driver its data are built */
        printf("ready\n");
        fflush(stdout);
    }
}

static int done(double start, double seconds, uint64_t ops) {
    if ((ops & 0xfff) != 0) return 0;
    if (stop) return 1;
    return seconds > 0 && now() - start >= seconds;
}

static uint64_t run_probe(size_t bytes, double seconds, double *elapsed) {
    size_t n = pow2_below(bytes / sizeof(struct bucket));
    struct bucket *t = malloc(n * sizeof *t);
    if (!t) { perror("malloc"); exit(1); }
    for (size_t i = 0; i < n; i++) { t[i].key = i; t[i].value = mix(i); }
    uint64_t mask = n - 1, idx = 0, ops = 0, sum = 0;
    ready(seconds);
    double start = now(), cpu0 = cpu_now();
    while (!done(start, seconds, ops)) {
        struct bucket *b = &t[idx];
        sum += b->key;
        idx = (b->value ^ ops) & mask;
        ops++;
    }
    *elapsed = cpu_now() - cpu0;
    if (sum == 42) fprintf(stderr, " ");
    free(t);
    return ops;
}

static uint64_t run_scan(size_t bytes, double seconds, int random_access, double *elapsed) {
    size_t n = pow2_below(bytes / sizeof(uint64_t));
    uint64_t *a = malloc(n * sizeof *a);
    if (!a) { perror("malloc"); exit(1); }
    for (size_t i = 0; i < n; i++) a[i] = i;
    uint64_t mask = n - 1, ops = 0, sum = 0, x = 1;
    ready(seconds);
    double start = now(), cpu0 = cpu_now();
    while (!done(start, seconds, ops)) {
        if (random_access) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            sum += a[(x >> 11) & mask];
        } else {
            sum += a[ops & mask];
        }
        ops++;
    }
    *elapsed = cpu_now() - cpu0;
    if (sum == 42) fprintf(stderr, " ");
    free(a);
    return ops;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s probe|random|stream BYTES SECONDS\n", argv[0]);
        return 2;
    }
    signal(SIGTERM, on_term);
    size_t bytes = strtoull(argv[2], NULL, 10);
    double seconds = strtod(argv[3], NULL), elapsed = 0;
    uint64_t ops;
    if (strcmp(argv[1], "probe") == 0) ops = run_probe(bytes, seconds, &elapsed);
    else if (strcmp(argv[1], "random") == 0) ops = run_scan(bytes, seconds, 1, &elapsed);
    else if (strcmp(argv[1], "stream") == 0) ops = run_scan(bytes, seconds, 0, &elapsed);
    else { fprintf(stderr, "unknown mode %s\n", argv[1]); return 2; }
    printf("{\"mode\": \"%s\", \"bytes\": %zu, \"ops\": %llu, \"seconds\": %.3f, \"ns_per_op\": %.3f}\n",
           argv[1], bytes, (unsigned long long)ops, elapsed, ops ? elapsed * 1e9 / (double)ops : 0.0);
    return 0;
}
