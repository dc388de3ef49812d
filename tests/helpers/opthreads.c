/* Operator threads with known duty cycles: a stand-in for an operator-centric engine.
 *
 *   opthreads PERIOD_MS SECONDS UNITS_PER_MS NAME:DUTY [NAME:DUTY ...]
 *
 * Each NAME:DUTY starts a thread named NAME (pthread_setname_np, <= 15 bytes)
 * that, every PERIOD_MS, is handed DUTY x PERIOD_MS worth of work and sleeps
 * until the next period once it is done (an always-on operator fed at a fixed
 * rate).  A thread that falls behind catches up without sleeping, so when its
 * core keeps up its throughput is the offered load and its CPU use is DUTY of a
 * core; work not finished by the end is not counted, so a core that does not
 * keep up shows as lower throughput (and longer latency: release to completion).  UNITS_PER_MS is the work rate of one core in units per
 * millisecond of CPU time; 0 calibrates it first (on thread CPU time, so other
 * load does not skew it).
 *
 * Prints "ready UNITS_PER_MS TID..." once every thread is named and waiting,
 * then starts the clock on reading a line ("go") from stdin, so a harness can
 * profile or pin the threads first.  After SECONDS it prints one JSON object
 * per thread and exits 0.  Exit status 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define ITERS_PER_UNIT 1000

struct op {
    char name[16];
    double duty;
    pthread_t thread;
    pid_t tid;
    uint64_t units_per_period;
    uint64_t periods, late, units;
    double *latency_ms;
    size_t n_latency, cap_latency;
    double cpu_s;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ready_count, go;
static struct timespec t_start, t_end;
static long period_ns;
static volatile uint64_t sink;

static uint64_t work(uint64_t units) {
    uint64_t x = 88172645463325252ULL ^ units;
    for (uint64_t u = 0; u < units; u++)
        for (int i = 0; i < ITERS_PER_UNIT; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    sink = x;
    return x;
}

static double ts_s(const struct timespec *t) { return (double)t->tv_sec + (double)t->tv_nsec * 1e-9; }

static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return ts_s(&t);
}

static void add_ns(struct timespec *t, long ns) {
    t->tv_nsec += ns;
    while (t->tv_nsec >= 1000000000L) {
        t->tv_nsec -= 1000000000L;
        t->tv_sec++;
    }
}

static int before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Units of work one core does per millisecond of CPU time (best of five ~60 ms runs). */
static double calibrate(void) {
    double best = 0.0;
    for (int r = 0; r < 5; r++) {
        uint64_t units = 1;
        double t0 = thread_cpu_s(), dt;
        do {
            work(units);
            dt = thread_cpu_s() - t0;
            units *= 2;
        } while (dt < 0.03);
        t0 = thread_cpu_s();
        work(units);
        dt = thread_cpu_s() - t0;
        double rate = (double)units / (dt * 1e3);
        if (rate > best) best = rate;
    }
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *run(void *arg) {
    struct op *op = arg;
    pthread_setname_np(pthread_self(), op->name);
    pthread_mutex_lock(&lock);
    op->tid = (pid_t)syscall(SYS_gettid);
    ready_count++;
    pthread_cond_broadcast(&cond);
    while (!go) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);

    double cpu0 = thread_cpu_s();
    struct timespec next = t_start, now;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        /* Stop at the end: no period released after it, and work still owed then is
         * not done (a thread that fell behind shows it as lower throughput). */
        if (!before(&next, &t_end) || !before(&now, &t_end)) break;
        if (before(&now, &next)) {
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR) {
            }
        } else if (op->periods > 0) {
            op->late++;
        }
        work(op->units_per_period);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!before(&now, &t_end)) break; /* finished after the end: not counted */
        op->units += op->units_per_period;
        op->periods++;
        if (op->n_latency < op->cap_latency)
            op->latency_ms[op->n_latency++] = (ts_s(&now) - ts_s(&next)) * 1e3;
        add_ns(&next, period_ns);
    }
    op->cpu_s = thread_cpu_s() - cpu0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s PERIOD_MS SECONDS UNITS_PER_MS NAME:DUTY...\n", argv[0]);
        return 2;
    }
    char *end;
    double period_ms = strtod(argv[1], &end);
    int bad = *end || !(period_ms >= 1 && period_ms <= 10000);
    double seconds = strtod(argv[2], &end);
    bad |= *end || !(seconds > 0 && seconds <= 3600);
    double units_per_ms = strtod(argv[3], &end);
    bad |= *end || !(units_per_ms >= 0);
    int n = argc - 4;
    bad |= n > MAX_THREADS;
    if (bad) {
        fprintf(stderr, "opthreads: bad arguments\n");
        return 2;
    }
    static struct op ops[MAX_THREADS];
    for (int i = 0; i < n; i++) {
        const char *colon = strrchr(argv[4 + i], ':');
        size_t len = colon ? (size_t)(colon - argv[4 + i]) : 0;
        double duty = colon ? strtod(colon + 1, &end) : -1;
        if (!colon || len == 0 || len > 15 || *end || !(duty > 0 && duty <= 1)) {
            fprintf(stderr, "opthreads: bad operator %s (NAME:DUTY, NAME <= 15 bytes, 0 < DUTY <= 1)\n",
                    argv[4 + i]);
            return 2;
        }
        memcpy(ops[i].name, argv[4 + i], len);
        ops[i].duty = duty;
    }
    if (units_per_ms == 0) units_per_ms = calibrate();
    period_ns = (long)(period_ms * 1e6);
    size_t periods = (size_t)(seconds * 1e3 / period_ms) + 2;
    for (int i = 0; i < n; i++) {
        double u = ops[i].duty * period_ms * units_per_ms;
        ops[i].units_per_period = u < 1 ? 1 : (uint64_t)(u + 0.5);
        ops[i].latency_ms = calloc(periods, sizeof(double));
        ops[i].cap_latency = ops[i].latency_ms ? periods : 0;
        if (pthread_create(&ops[i].thread, NULL, run, &ops[i]) != 0) {
            fprintf(stderr, "opthreads: cannot start thread %d\n", i);
            return 1;
        }
    }
    pthread_mutex_lock(&lock);
    while (ready_count < n) pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    printf("ready %.3f", units_per_ms);
    for (int i = 0; i < n; i++) printf(" %d", (int)ops[i].tid);
    printf("\n");
    fflush(stdout);

    char line[64];
    if (!fgets(line, sizeof line, stdin)) { /* no harness: start anyway */
    }
    pthread_mutex_lock(&lock);
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    add_ns(&t_start, 1000000L); /* first period 1 ms from now, same for every thread */
    t_end = t_start;
    t_end.tv_sec += (time_t)seconds;
    add_ns(&t_end, (long)((seconds - (double)(time_t)seconds) * 1e9));
    go = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++) pthread_join(ops[i].thread, NULL);

    double expected = seconds * 1e3 / period_ms;
    for (int i = 0; i < n; i++) {
        struct op *op = &ops[i];
        double p50 = 0, p99 = 0;
        if (op->n_latency) {
            qsort(op->latency_ms, op->n_latency, sizeof(double), cmp_double);
            p50 = op->latency_ms[op->n_latency / 2];
            p99 = op->latency_ms[(size_t)((double)(op->n_latency - 1) * 0.99)];
        }
        printf("{\"name\": \"%s\", \"tid\": %d, \"duty\": %.4f, \"units_per_period\": %llu, "
               "\"periods\": %llu, \"expected_periods\": %.1f, \"late_periods\": %llu, "
               "\"throughput_units_per_s\": %.1f, \"offered_units_per_s\": %.1f, \"cpu_s\": %.6f, "
               "\"cpu_util\": %.6f, \"latency_ms_p50\": %.3f, \"latency_ms_p99\": %.3f}\n",
               op->name, (int)op->tid, op->duty, (unsigned long long)op->units_per_period,
               (unsigned long long)op->periods, expected, (unsigned long long)op->late,
               (double)op->units / seconds, (double)op->units_per_period * expected / seconds,
               op->cpu_s, op->cpu_s / seconds, p50, p99);
        free(op->latency_ms);
    }
    fflush(stdout);
    return 0;
}
