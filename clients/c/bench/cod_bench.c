/* The C side of bench/cclient_bench.py: one measurement per run, one JSON object out.
 *
 *   cod_bench query SOCKET N       execute_query of one fact, N round trips (after 200 warm-up)
 *   cod_bench echo SOCKET N        the same request frame to a framed echo server (the floor)
 *   cod_bench add_facts SOCKET K   K batches of 10,000 facts, one cod_add_facts each; with K = 0,
 *                                  one batch per line read from stdin, one JSON line each (so
 *                                  that a caller can interleave them with its own, on one
 *                                  connection)
 *   cod_bench listing1 SOCKET N    connect -> one register_task with Listing 1's properties,
 *                                  facts and cost function -> its first allocation upcall
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cod.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time of this process (user + system), seconds: the client's own share of a call. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void summary_us(const char *what, double *t, size_t n, const char *extra)
{
    qsort(t, n, sizeof *t, cmp_double);
    printf("{\"what\": \"%s\", \"n\": %zu, \"median_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f%s}\n", what, n,
           t[n / 2] * 1e6, t[(size_t)((double)(n - 1) * 0.99)] * 1e6, t[n - 1] * 1e6, extra ? extra : "");
}

static cod_conn *connect_or_die(const char *path, const char *app)
{
    cod_conn *c = cod_connect(path, app);
    if (!c) {
        fprintf(stderr, "cod_bench: %s\n", cod_connect_error());
        exit(1);
    }
    return c;
}

static int bench_query(const char *path, size_t n)
{
    cod_conn *c = connect_or_die(path, "cbench");
    if (cod_add_fact(c, "bench_fact(42)")) {
        fprintf(stderr, "cod_bench: %s\n", cod_errstr(c));
        return 1;
    }
    double *t = malloc(n * sizeof *t), cpu0 = 0;
    for (size_t i = 0; i < n + 200; i++) {
        if (i == 200)
            cpu0 = cpu_s();
        double t0 = now_s();
        cod_reply *r = cod_query_goal(c, "bench_fact(X)", NULL);
        double dt = now_s() - t0;
        long long x = 0;
        if (!r || cod_value_int(cod_reply_get(r, 0, "X"), &x) || x != 42) {
            fprintf(stderr, "cod_bench: wrong answer: %s\n", r ? "" : cod_errstr(c));
            return 1;
        }
        cod_reply_free(r);
        if (i >= 200)
            t[i - 200] = dt;
    }
    char extra[128];
    snprintf(extra, sizeof extra, ", \"direct\": %s, \"client_cpu_us_per_call\": %.2f",
             cod_is_direct(c) ? "true" : "false", (cpu_s() - cpu0) / (double)n * 1e6);
    summary_us("c_query", t, n, extra);
    free(t);
    cod_free(c);
    return 0;
}

static int bench_echo(const char *path, size_t n)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        perror("cod_bench: echo");
        return 1;
    }
    const char *body = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"execute_query\",\"params\":{\"goal\":\"bench_fact(X)\"}}";
    size_t len = strlen(body);
    char *frame = malloc(len + 4), *back = malloc(len + 4);
    frame[0] = (char)(len >> 24);
    frame[1] = (char)(len >> 16);
    frame[2] = (char)(len >> 8);
    frame[3] = (char)len;
    memcpy(frame + 4, body, len);
    double *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n + 200; i++) {
        double t0 = now_s();
        if (send(fd, frame, len + 4, 0) != (ssize_t)(len + 4))
            return 1;
        size_t got = 0;
        while (got < len + 4) {
            ssize_t k = recv(fd, back + got, len + 4 - got, 0);
            if (k <= 0)
                return 1;
            got += (size_t)k;
        }
        if (i >= 200)
            t[i - 200] = now_s() - t0;
    }
    summary_us("c_echo", t, n, NULL);
    free(t);
    free(frame);
    free(back);
    close(fd);
    return 0;
}

static int bench_add_facts(const char *path, size_t k)
{
    cod_conn *c = connect_or_die(path, "cbench_facts");
    enum { N = 10000 };
    char **facts = malloc(N * sizeof *facts);
    for (size_t i = 0; i < N; i++)
        facts[i] = malloc(64);
    int serve = k == 0;
    if (serve)
        k = 1;
    double *rate = malloc(k * sizeof *rate), *cpu = malloc(k * sizeof *cpu);
    char line[64];
    for (size_t rep = 0; serve || rep < k; rep++) {
        if (serve && !fgets(line, sizeof line, stdin))
            break;
        size_t slot = serve ? 0 : rep;
        for (size_t i = 0; i < N; i++)
            snprintf(facts[i], 64, "bench_fact_%d_%zu(%zu, 12345)", (int)getpid(), rep, i);
        double c0 = cpu_s(), t0 = now_s();
        if (cod_add_facts(c, (const char *const *)facts, N)) {
            fprintf(stderr, "cod_bench: %s\n", cod_errstr(c));
            return 1;
        }
        rate[slot] = N / (now_s() - t0);
        cpu[slot] = (cpu_s() - c0) * 1e3;
        if (serve) {
            printf("{\"facts_per_s\": %.0f, \"client_cpu_ms\": %.2f}\n", rate[0], cpu[0]);
            fflush(stdout);
        }
    }
    if (serve) {
        free(rate);
        free(cpu);
        for (size_t i = 0; i < N; i++)
            free(facts[i]);
        free(facts);
        cod_free(c);
        return 0;
    }
    qsort(rate, k, sizeof *rate, cmp_double);
    qsort(cpu, k, sizeof *cpu, cmp_double);
    printf("{\"what\": \"c_add_facts\", \"batches\": %zu, \"facts_per_batch\": %d, \"median_facts_per_s\": %.0f, "
           "\"min_facts_per_s\": %.0f, \"max_facts_per_s\": %.0f, \"client_cpu_ms_per_batch\": %.2f}\n",
           k, N, rate[k / 2], rate[0], rate[k - 1], cpu[k / 2]);
    free(cpu);
    for (size_t i = 0; i < N; i++)
        free(facts[i]);
    free(facts);
    free(rate);
    cod_free(c);
    return 0;
}

static void on_upcall(cod_conn *c, const cod_event *ev, void *ud)
{
    (void)c;
    (void)ev;
    *(int *)ud = 1;
}

static int bench_listing1(const char *path, size_t n)
{
    double *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "ccscs%zu", i);
        int got = 0;
        double t0 = now_s();
        cod_conn *c = connect_or_die(path, name);
        cod_task *task = cod_task_new(name);
        cod_task_set_int(task, COD_MAX_CORES, 2);
        cod_task_set_string(task, COD_BOUND, "cpu");
        cod_task_add_string(task, COD_SENSITIVE, "cache");
        cod_task_add_string(task, COD_SENSITIVE, "numa");
        const char *facts[] = {"db_ntuple(3750000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(256)",
                               "db_rtime(3000)"};
        for (size_t k = 0; k < 5; k++)
            cod_task_add_fact(task, facts[k]);
        cod_task_add_procedure(task,
                               "db_cost_fn(X, Y, Z, NrCores) :- NrCores is (X * ((0.47 * Y) + 265.29)) / (3750000 * Z).");
        if (cod_register_task(c, task, on_upcall, &got, NULL)) {
            fprintf(stderr, "cod_bench: %s\n", cod_errstr(c));
            return 1;
        }
        while (!got && now_s() - t0 < 5)
            cod_wait_event(c, 100);
        t[i] = now_s() - t0;
        cod_task_free(task);
        cod_free(c);
        usleep(10000); /* let the daemon forget the task before the next round */
    }
    summary_us("c_listing1", t, n, ", \"calls\": 2");
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s query|echo|add_facts|listing1 SOCKET N\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)strtoul(argv[3], NULL, 10);
    if (n == 0 && strcmp(argv[1], "add_facts") != 0)
        return 2;
    if (strcmp(argv[1], "query") == 0)
        return bench_query(argv[2], n);
    if (strcmp(argv[1], "echo") == 0)
        return bench_echo(argv[2], n);
    if (strcmp(argv[1], "add_facts") == 0)
        return bench_add_facts(argv[2], n);
    if (strcmp(argv[1], "listing1") == 0)
        return bench_listing1(argv[2], n);
    fprintf(stderr, "cod_bench: unknown measurement %s\n", argv[1]);
    return 2;
}
