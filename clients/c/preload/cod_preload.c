/* libcod_preload.so: an unmodified process's new pages on its COD task's memory nodes.
 *
 *   LD_PRELOAD=libcod_preload.so COD_TASK=db [COD_TASK_MIN_CORES=2] [COD_TASK_MAX_CORES=4]
 *       [COD_TASK_WORKING_SET_BYTES=N] [COD_MEMORY_POLICY=bind|preferred|interleave] program ...
 *
 * In affinity mode the RM pins a task's threads and moves its resident pages, but a memory policy
 * belongs to the thread that sets it (set_mempolicy(2)): nothing outside the process can say where
 * its next pages go.  This library does it for a program that does not call libcod: before main()
 * it connects to the RM ($COD_SOCKET or the default socket), registers the process as task
 * $COD_TASK (the properties from the environment), and sets the allocation's memory nodes as the
 * policy of the calling thread, which every thread created later inherits.  A thread of its own
 * waits for the task's allocation_changed upcalls; on each it sets the new nodes in every thread
 * of the process: it signals each (a real-time signal, SIGRTMAX - 3 unless COD_PRELOAD_SIGNAL
 * names another number), whose handler calls set_mempolicy (async-signal-safe: one system call),
 * listing the threads again until no new one appears.  The RM moves the pages already resident.
 *
 * Without COD_TASK it does nothing.  When the RM cannot be reached or refuses the task it says so
 * once on stderr and leaves the process as it is (the program runs, unmanaged).  The program must
 * not use the signal itself.  docs/design-enforce.md, "Memory follows cores", has what it
 * guarantees and what not.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cod.h"

#define MAX_NODES 1024
#define WORD_BITS (8 * sizeof(unsigned long))
#define MAX_THREADS 4096
#define ROUNDS 4

static cod_conn *conn;
static int policy_mode = COD_MEM_BIND;
static int policy_signal;
/* The policy the handler sets: written by the event thread before it signals, read in handlers. */
static unsigned long policy_mask[MAX_NODES / WORD_BITS];
static unsigned long policy_maxnode;
static atomic_int applied;  /* handlers that ran since the event thread last signalled */

static void say(const char *what, const char *why)
{
    fprintf(stderr, "cod_preload: %s%s%s; the process runs unmanaged\n", what, why ? ": " : "", why ? why : "");
}

static void set_policy(void)
{
    int saved = errno;
    syscall(SYS_set_mempolicy, policy_mode, policy_mask, policy_maxnode);
    errno = saved;
}

static void on_signal(int sig)
{
    (void)sig;
    set_policy();
    atomic_fetch_add(&applied, 1);
}

/* The allocation's memory nodes as the policy to set; 0 when it has none (no CPU yet). */
static int load_policy(const cod_allocation *a)
{
    if (!a->nmemory_nodes)
        return 0;
    size_t n = policy_mode == COD_MEM_PREFERRED ? 1 : a->nmemory_nodes;
    memset(policy_mask, 0, sizeof policy_mask);
    int top = 0;
    for (size_t i = 0; i < n; i++) {
        int node = a->memory_nodes[i];
        if (node < 0 || node >= MAX_NODES)
            return 0;
        policy_mask[(unsigned)node / WORD_BITS] |= 1UL << ((unsigned)node % WORD_BITS);
        top = node > top ? node : top;
    }
    policy_maxnode = ((unsigned long)top / WORD_BITS + 1) * WORD_BITS + 1; /* the kernel reads maxnode - 1 bits */
    return 1;
}

static int seen_before(const pid_t *done, size_t n, pid_t tid)
{
    for (size_t i = 0; i < n; i++)
        if (done[i] == tid)
            return 1;
    return 0;
}

/* Every thread of the process gets the policy: this one directly, the others by the signal;
 * listed again until no new thread appears (a thread created meanwhile inherits its creator's). */
static void apply_everywhere(void)
{
    static pid_t done[MAX_THREADS];
    size_t ndone = 0;
    pid_t self = (pid_t)syscall(SYS_gettid), pid = getpid();
    set_policy();
    done[ndone++] = self;
    for (int round = 0; round < ROUNDS; round++) {
        DIR *d = opendir("/proc/self/task");
        if (!d)
            return;
        int sent = 0;
        atomic_store(&applied, 0);
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            pid_t tid = (pid_t)atoi(e->d_name);
            if (tid <= 0 || seen_before(done, ndone, tid) || ndone == MAX_THREADS)
                continue;
            if (syscall(SYS_tgkill, pid, tid, policy_signal) == 0)
                sent++;
            done[ndone++] = tid;
        }
        closedir(d);
        if (!sent)
            return;
        /* Wait (at most 1 s) for the handlers: a thread that exits meanwhile never runs its own. */
        for (int i = 0; i < 1000 && atomic_load(&applied) < sent; i++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

static void on_allocation(cod_conn *c, const cod_event *ev, void *userdata)
{
    (void)c;
    (void)userdata;
    cod_allocation a = {0};
    if (cod_event_allocation(ev, &a) == COD_OK && load_policy(&a))
        apply_everywhere();
    cod_allocation_clear(&a);
}

static void *wait_for_upcalls(void *arg)
{
    (void)arg;
    for (;;) {
        if (cod_wait_event(conn, -1) < 0)
            return NULL;  /* the RM has gone: the last policy stays */
    }
}

static int env_int(cod_task *t, const char *var, const char *property)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return COD_OK;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (*end) {
        fprintf(stderr, "cod_preload: %s=%s is not an integer\n", var, v);
        return COD_EINVAL;
    }
    return cod_task_set_int(t, property, n);
}

static int read_settings(void)
{
    const char *mode = getenv("COD_MEMORY_POLICY");
    if (mode && strcmp(mode, "preferred") == 0)
        policy_mode = COD_MEM_PREFERRED;
    else if (mode && strcmp(mode, "interleave") == 0)
        policy_mode = COD_MEM_INTERLEAVE;
    else if (mode && *mode && strcmp(mode, "bind") != 0) {
        fprintf(stderr, "cod_preload: COD_MEMORY_POLICY=%s: use bind, preferred or interleave\n", mode);
        return -1;
    }
    const char *sig = getenv("COD_PRELOAD_SIGNAL");
    policy_signal = sig && *sig ? atoi(sig) : SIGRTMAX - 3;
    if (policy_signal < SIGRTMIN || policy_signal > SIGRTMAX) {
        fprintf(stderr, "cod_preload: COD_PRELOAD_SIGNAL=%s: a real-time signal, %d to %d\n", sig, SIGRTMIN, SIGRTMAX);
        return -1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(policy_signal, &sa, NULL);
}

static int register_task(const char *name, cod_allocation *first)
{
    cod_task *t = cod_task_new(name);
    int rc = t ? COD_OK : COD_EINVAL;
    if (rc == COD_OK)
        rc = env_int(t, "COD_TASK_MIN_CORES", COD_MIN_CORES);
    if (rc == COD_OK)
        rc = env_int(t, "COD_TASK_MAX_CORES", COD_MAX_CORES);
    if (rc == COD_OK)
        rc = env_int(t, "COD_TASK_WORKING_SET_BYTES", COD_WORKING_SET_BYTES);
    if (rc == COD_OK)
        rc = cod_register_task(conn, t, on_allocation, NULL, first);
    cod_task_free(t);
    return rc;
}

__attribute__((constructor)) static void cod_preload_start(void)
{
    const char *name = getenv("COD_TASK");
    if (!name || !*name)
        return;
    if (read_settings() != 0) {
        say("bad settings", NULL);
        return;
    }
    conn = cod_connect(NULL, getenv("COD_APP"));
    if (!conn) {
        say(cod_connect_error(), NULL); /* "no COD daemon answers on PATH: why", as every client says */
        return;
    }
    cod_allocation first = {0};
    if (register_task(name, &first) != COD_OK) {
        say("the RM did not register the task", cod_errstr(conn));
        cod_free(conn);
        conn = NULL;
        return;
    }
    if (load_policy(&first))
        set_policy();  /* only this thread exists yet: every later one inherits it */
    cod_allocation_clear(&first);
    /* The event thread takes none of the program's signals. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    if (pthread_create(&th, NULL, wait_for_upcalls, NULL) == 0)
        pthread_detach(th);
    else
        say("no thread for the upcalls", strerror(errno));
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
