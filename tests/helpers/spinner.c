/* A test process with N threads that spin (busy) or sleep (idle).
 *
 *   spinner NTHREADS spin|sleep
 *
 * The main thread waits on stdin; the others spin or sleep ("1 spin" gets one
 * spinning worker, so two threads).
 * Prints "ready <tid> <tid> ..." once every thread runs.  Each line read on
 * stdin ("spawn") starts one more thread and prints "tid <tid>" once it runs,
 * so tests can check that a thread created after pinning is pinned too.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int spin;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t started = PTHREAD_COND_INITIALIZER;
static pid_t last_tid;

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    last_tid = (pid_t)syscall(SYS_gettid);
    pthread_cond_signal(&started);
    pthread_mutex_unlock(&lock);
    volatile unsigned long n = 0;
    for (;;) {
        if (spin) n++;
        else pause();
    }
    return NULL;
}

static pid_t start_thread(void) {
    pthread_t t;
    pthread_mutex_lock(&lock);
    last_tid = 0;
    if (pthread_create(&t, NULL, worker, NULL) != 0) { perror("pthread_create"); exit(1); }
    while (last_tid == 0) pthread_cond_wait(&started, &lock);
    pid_t tid = last_tid;
    pthread_mutex_unlock(&lock);
    return tid;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: spinner NTHREADS spin|sleep\n"); return 2; }
    int n = atoi(argv[1]);
    spin = strcmp(argv[2], "spin") == 0;
    printf("ready %d", (int)getpid());
    /* The main thread serves stdin; with one thread asked to spin, a worker spins. */
    if (n < 2 && spin) n = 2;
    for (int i = 1; i < n; i++) printf(" %d", (int)start_thread());
    printf("\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        printf("tid %d\n", (int)start_thread());
        fflush(stdout);
    }
    return 0;  /* stdin closed: exit (all threads with it) */
}
