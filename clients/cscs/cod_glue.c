/* CSCS under COD: cod_glue.h over libcod (clients/c), as the paper's Listing 1.
 *
 * Open: connect, register the task with its system properties (max_cores, CPU-bound, cache-
 * and NUMA-sensitive), its application facts (db_ntuple, db_tsize, db_nquery, db_nupdate,
 * db_rtime) and its cost function, and with min_cores and working_set_bytes derived by the
 * SKB from the initial-deployment stored procedure (dbos_cost_function/3, Listing 3): the
 * daemon evaluates them, admits the task and sends the first allocation upcall before its
 * reply.  Poll (before every scan phase): run the upcalls that arrived (cod_dispatch never
 * blocks); when the newest one changes our cores, ask the SKB for the tuple redistribution
 * (cscs_redistribute/5, stored_procedures/cscs.pl) and hand the plan to the engine.  Applied:
 * ack_allocation with that upcall's epoch, so the RM hands the cores we gave up on at once.
 *
 * A listener thread waits for upcalls (cod_wait_event) so that the moment each one arrives is
 * known even while a scan phase runs; the engine acts on it at its next poll, between scan
 * phases.  Lines starting "# cod:" report each step with wall-clock times (for the demo and
 * the tests). */
#include "cod_glue.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cod.h>

/* The paper's constants (Section 4.4), used when no calibrated cost function is given. */
static const char PAPER_COST_FN[] =
    "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
    "    Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs).\n";

struct cod_glue {
    cod_conn *c;
    char name[64];
    pthread_t listener;
    int listening;
    int stop;             /* under mu */
    pthread_mutex_t mu;   /* guards what the handler writes */
    /* The newest allocation heard, and whether the engine has yet to act on it. */
    long long epoch;
    int *cores;
    size_t ncores;
    int pending;
    double heard_at;      /* wall clock when its handler ran */
    double deadline_s;    /* from heard_at; < 0 when nothing is taken away */
    /* The upcall whose plan the engine is applying (cod_glue_applied acks it). */
    long long applying_epoch;
    double applying_heard_at;
    double applying_deadline_s;
};

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void cpus_text(const int *v, size_t n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "," : "", v[i]);
    if (n == 0)
        snprintf(buf, len, "none");
}

static void on_allocation(cod_conn *c, const cod_event *ev, void *userdata)
{
    (void)c;
    struct cod_glue *g = userdata;
    cod_allocation a = { 0 };
    if (cod_event_allocation(ev, &a) != 0)
        return;
    double now = wall_s();
    pthread_mutex_lock(&g->mu);
    if (a.epoch > g->epoch) {
        free(g->cores);
        g->cores = a.cores;
        g->ncores = a.ncores;
        a.cores = NULL;
        a.ncores = 0;
        g->epoch = a.epoch;
        g->pending = 1;
        g->heard_at = now;
        g->deadline_s = a.nremoved ? a.deadline_s : -1;
        char cores[256], removed[256], added[256], line[1024];
        cpus_text(g->cores, g->ncores, cores, sizeof cores);
        cpus_text(a.removed, a.nremoved, removed, sizeof removed);
        cpus_text(a.added, a.nadded, added, sizeof added);
        int n = snprintf(line, sizeof line, "# cod: upcall epoch %lld at wall %.3f: cores %s (added %s, removed %s",
                         g->epoch, now, cores, added, removed);
        if (a.nremoved && a.deadline_s > 0 && n > 0 && (size_t)n < sizeof line)
            n += snprintf(line + n, sizeof line - (size_t)n, ", deadline in %.0f ms", a.deadline_s * 1e3);
        if (n > 0 && (size_t)n < sizeof line)
            snprintf(line + n, sizeof line - (size_t)n, "): %s\n", a.reason ? a.reason : "");
        fputs(line, stdout);
        fflush(stdout);
    }
    pthread_mutex_unlock(&g->mu);
    cod_allocation_clear(&a);
}

static void *listener_main(void *arg)
{
    struct cod_glue *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        int stop = g->stop;
        pthread_mutex_unlock(&g->mu);
        if (stop)
            return NULL;
        if (cod_wait_event(g->c, 50) < 0) {
            /* The daemon is gone: the engine keeps its cores; say so once. */
            printf("# cod: lost the RM: %s\n", cod_errstr(g->c));
            fflush(stdout);
            return NULL;
        }
    }
}

static int int_of(const cod_value *v, long long *out)
{
    return v ? cod_value_int(v, out) : -1;
}

static int read_file(const char *path, char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--cost-fn %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        snprintf(err, errlen, "--cost-fn %s: %s", path, bad ? "read error" : "out of memory");
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

static int fail(struct cod_glue *g, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "COD: %s: %s", what, cod_errstr(g->c));
    return -1;
}

/* A glue not yet connected: no allocation heard, none being applied; NULL when out of memory. */
static struct cod_glue *glue_new(const char *name)
{
    struct cod_glue *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->epoch = -1;
    g->applying_epoch = -1;
    pthread_mutex_init(&g->mu, NULL);
    snprintf(g->name, sizeof g->name, "%s", name ? name : "cscs");
    return g;
}

/* Lines 19-20 of Listing 1: the SLA, the cost function, and the requirements derived by the
 * SKB from Listing 3's procedure.  The daemon evaluates them again whenever a fact they read
 * changes.  More cores than this process may use cannot be had: the SLA is then missed, and
 * said so when the task is registered.  Nonzero when out of memory or the text is bad. */
static int add_sla_requirements(cod_task *t, const struct glue_config *cfg, const char *cost_fn)
{
    char min_q[160], ws_q[200], fact[128];
    snprintf(min_q, sizeof min_q, "dbos_cost_function(_, N0, _), N is min(N0, %d)", cfg->max_cores);
    snprintf(ws_q, sizeof ws_q,
             "dbos_cost_function(_, N0, _), db_ntuple(T), db_tsize(S), P is T * S // min(N0, %d)",
             cfg->max_cores);
    snprintf(fact, sizeof fact, "db_rtime(%.0f)", cfg->sla_ms < 1 ? 1 : cfg->sla_ms);
    return cod_task_add_fact(t, fact) || cod_task_add_procedure(t, cost_fn ? cost_fn : PAPER_COST_FN) ||
           cod_task_set_derived(t, COD_MIN_CORES, min_q, "N") ||
           cod_task_set_derived(t, COD_WORKING_SET_BYTES, ws_q, "P");
}

/* The task's description: lines 6-20 of Listing 1.  NULL with err set when it cannot be
 * built. */
static cod_task *describe_task(const char *name, const struct glue_config *cfg, const char *cost_fn,
                               char *err, size_t errlen)
{
    char fact[128];
    cod_task *t = cod_task_new(name);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* Lines 6-9: system-level properties. */
    int bad = cod_task_set_int(t, COD_MAX_CORES, cfg->max_cores) || cod_task_set_string(t, COD_BOUND, "cpu") ||
              cod_task_add_string(t, COD_SENSITIVE, "cache") || cod_task_add_string(t, COD_SENSITIVE, "numa");
    /* Lines 11-17: the dataset, the workload, the SLA and the cost function (Section 4.4). */
    snprintf(fact, sizeof fact, "db_ntuple(%zu)", cfg->ntuples);
    bad = bad || cod_task_add_fact(t, fact);
    snprintf(fact, sizeof fact, "db_tsize(%zu)", cfg->tuple_bytes);
    bad = bad || cod_task_add_fact(t, fact);
    snprintf(fact, sizeof fact, "db_nquery(%zu)", cfg->batch_queries);
    bad = bad || cod_task_add_fact(t, fact);
    snprintf(fact, sizeof fact, "db_nupdate(%zu)", cfg->batch_updates);
    bad = bad || cod_task_add_fact(t, fact);
    if (cfg->sla_ms > 0)
        bad = bad || add_sla_requirements(t, cfg, cost_fn);
    else if (cost_fn)
        bad = bad || cod_task_add_procedure(t, cost_fn);
    if (bad) {
        snprintf(err, errlen, "COD: building the task description: out of memory or bad text");
        cod_task_free(t);
        return NULL;
    }
    return t;
}

/* Registers the task and takes the cores of its first allocation, whose upcall comes before
 * the reply (its handler runs at the dispatch here).  -1 with err set when registering fails
 * or the allocation has no CPU. */
static int register_and_take_first_allocation(struct cod_glue *g, cod_task *t, char *err, size_t errlen)
{
    cod_allocation first = { 0 };
    int rc = -1;
    if (cod_register_task(g->c, t, on_allocation, g, &first) != 0) {
        fail(g, "registering the task", err, errlen);
        goto done;
    }
    cod_dispatch(g->c);
    if (first.epoch > g->epoch) {
        free(g->cores);
        g->cores = first.cores;
        g->ncores = first.ncores;
        first.cores = NULL;
        g->epoch = first.epoch;
    }
    g->pending = 0;
    if (g->ncores == 0) {
        snprintf(err, errlen, "COD: the RM admitted the task but gave it no CPU");
        goto done;
    }
    rc = 0;
done:
    cod_allocation_clear(&first);
    return rc;
}

/* The caller's copy of the cores the glue holds. */
static int copy_cores(const struct cod_glue *g, int **cpus, size_t *ncpus, char *err, size_t errlen)
{
    *cpus = malloc(g->ncores * sizeof **cpus);
    if (!*cpus) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(*cpus, g->cores, g->ncores * sizeof **cpus);
    *ncpus = g->ncores;
    return 0;
}

/* The deployment the SKB derived for the SLA (Listing 3), when it answers. */
static void print_derived_deployment(struct cod_glue *g, const struct glue_config *cfg)
{
    cod_reply *d = cod_query(g->c, "dbos_cost_function(Status, NrCores, PartSize)");
    long long st = -1, n = 0, part = 0;
    if (d && cod_reply_count(d) > 0 && int_of(cod_reply_get(d, 0, "Status"), &st) == 0 &&
        int_of(cod_reply_get(d, 0, "NrCores"), &n) == 0 && int_of(cod_reply_get(d, 0, "PartSize"), &part) == 0) {
        printf("# cod: deployment derived by the SKB (Listing 3) for an SLA of %.0f ms: %lld cores, "
               "partitions of %lld bytes, status %lld%s\n", cfg->sla_ms, n, part, st,
               n > cfg->max_cores ? " (more cores than this process may use: the SLA will be missed)" : "");
        fflush(stdout);
    }
    cod_reply_free(d);
}

int cod_glue_open(const struct glue_config *cfg, struct cod_glue **out, int **cpus,
                  size_t *ncpus, char *err, size_t errlen)
{
    *out = NULL;
    *cpus = NULL;
    *ncpus = 0;
    if (cfg->socket == NULL)
        return 0;
    struct cod_glue *g = glue_new(cfg->name);
    char *cost_fn = NULL;
    cod_task *t = NULL;
    int rc = -1;
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (cfg->cost_fn_path && read_file(cfg->cost_fn_path, &cost_fn, err, errlen) != 0)
        goto done;
    double t0 = wall_s();
    /* Listing 1, lines 1-4: bind to the RM and the SKB. */
    g->c = cod_connect(cfg->socket, g->name);
    if (!g->c) {
        snprintf(err, errlen, "COD: cannot connect to the RM at %s: %s", cfg->socket, cod_connect_error());
        goto done;
    }
    cod_set_timeout(g->c, 20000);
    t = describe_task(g->name, cfg, cost_fn, err, errlen);
    if (!t || register_and_take_first_allocation(g, t, err, errlen) != 0 ||
        copy_cores(g, cpus, ncpus, err, errlen) != 0)
        goto done;
    if (cfg->sla_ms > 0)
        print_derived_deployment(g, cfg);
    char now[256];
    cpus_text(g->cores, g->ncores, now, sizeof now);
    printf("# cod: registered as task %s with the RM at %s in %.1f ms: epoch %lld, cores %s%s\n", g->name,
           cfg->socket, (wall_s() - t0) * 1e3, g->epoch, now,
           cfg->sla_ms > 0 ? " (min_cores derived by the SKB from dbos_cost_function/3)" : "");
    fflush(stdout);
    int trc = pthread_create(&g->listener, NULL, listener_main, g);
    if (trc != 0) {
        snprintf(err, errlen, "cannot start the upcall listener: %s", strerror(trc));
        goto done;
    }
    g->listening = 1;
    *out = g;
    rc = 0;
done:
    cod_task_free(t);
    free(cost_fn);
    if (rc != 0)
        cod_glue_close(g);
    return rc;
}

/* Parts: [Cpu-Tuples, ...]; Moves: [move(From, To, N), ...]. */
static int parse_answer(const cod_value *parts, const cod_value *moves, struct plan *p)
{
    if (cod_value_type(parts) != COD_LIST || cod_value_type(moves) != COD_LIST)
        return -1;
    p->nparts = cod_value_length(parts);
    p->nmoves = cod_value_length(moves);
    p->parts = calloc(p->nparts ? p->nparts : 1, sizeof *p->parts);
    p->moves = calloc(p->nmoves ? p->nmoves : 1, sizeof *p->moves);
    if (!p->parts || !p->moves)
        return -1;
    for (size_t i = 0; i < p->nparts; i++) {
        const cod_value *x = cod_value_at(parts, i);
        const char *f = cod_value_functor(x);
        long long cpu, n;
        if (!f || strcmp(f, "-") != 0 || cod_value_length(x) != 2 || int_of(cod_value_at(x, 0), &cpu) ||
            int_of(cod_value_at(x, 1), &n) || cpu < 0 || n < 0)
            return -1;
        p->parts[i] = (struct plan_part){ .cpu = (int)cpu, .tuples = (size_t)n };
    }
    for (size_t i = 0; i < p->nmoves; i++) {
        const cod_value *x = cod_value_at(moves, i);
        const char *f = cod_value_functor(x);
        long long from, to, n;
        if (!f || strcmp(f, "move") != 0 || cod_value_length(x) != 3 || int_of(cod_value_at(x, 0), &from) ||
            int_of(cod_value_at(x, 1), &to) || int_of(cod_value_at(x, 2), &n) || from < 0 || to < 0 || n < 0)
            return -1;
        p->moves[i] = (struct plan_move){ .from = (int)from, .to = (int)to, .tuples = (size_t)n };
    }
    return 0;
}

static int same_cores(const struct plan_part *cur, size_t ncur, const int *cores, size_t n)
{
    if (ncur != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        int found = 0;
        for (size_t j = 0; j < ncur && !found; j++)
            found = cur[j].cpu == cores[i];
        if (!found)
            return 0;
    }
    return 1;
}

/* Appends text to a growing buffer; -1 when out of memory. */
static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        size_t ncap = (*cap ? *cap : 256) * 2 + (size_t)n;
        char *nb = realloc(*buf, ncap);
        if (!nb)
            return -1;
        if (!*buf)
            nb[0] = '\0';
        *buf = nb;
        *cap = ncap;
    }
}

int cod_glue_poll(struct cod_glue *g, const struct plan_part *cur, size_t ncur,
                  struct plan *plan, char *err, size_t errlen)
{
    if (!g)
        return 0;
    pthread_mutex_lock(&g->mu);
    int pending = g->pending;
    g->pending = 0;
    long long epoch = g->epoch;
    double heard_at = g->heard_at, deadline_s = g->deadline_s;
    size_t ncores = g->ncores;
    int *cores = pending ? malloc((ncores ? ncores : 1) * sizeof *cores) : NULL;
    if (cores)
        memcpy(cores, g->cores, ncores * sizeof *cores);
    pthread_mutex_unlock(&g->mu);
    if (!pending)
        return 0;
    if (!cores) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (same_cores(cur, ncur, cores, ncores)) {
        free(cores);
        cod_ack_allocation(g->c, g->name, epoch);
        return 0;
    }
    /* Tuple redistribution (Section 7.4) by the stored procedure in the SKB. */
    char *goal = NULL;
    size_t len = 0, cap = 0;
    int bad = append(&goal, &len, &cap, "cscs_redistribute([");
    for (size_t i = 0; i < ncur && !bad; i++)
        bad = append(&goal, &len, &cap, "%s%d-%zu", i ? "," : "", cur[i].cpu, cur[i].tuples);
    bad = bad || append(&goal, &len, &cap, "], [");
    for (size_t i = 0; i < ncores && !bad; i++)
        bad = append(&goal, &len, &cap, "%s%d", i ? "," : "", cores[i]);
    free(cores);
    bad = bad || append(&goal, &len, &cap, "], Status, Parts, Moves)");
    if (bad) {
        free(goal);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    double t0 = wall_s();
    printf("# cod: acting on epoch %lld at wall %.3f, %.1f ms after the upcall (the scan phase in progress "
           "finished first)\n", epoch, t0, (t0 - heard_at) * 1e3);
    cod_query_opts opts = { .first_only = 1 };
    cod_reply *r = cod_query_goal(g->c, goal, &opts);
    free(goal);
    int rc = -1;
    long long status = -1;
    if (!r) {
        snprintf(err, errlen, "tuple redistribution for epoch %lld: %s", epoch, cod_errstr(g->c));
    } else if (cod_reply_count(r) == 0) {
        snprintf(err, errlen, "tuple redistribution for epoch %lld: no answer", epoch);
    } else if (int_of(cod_reply_get(r, 0, "Status"), &status) != 0 || status != 0) {
        snprintf(err, errlen, "tuple redistribution for epoch %lld: status %lld%s", epoch, status,
                 status == 2 ? " (the tuples do not fit in the free memory of the new cores' nodes)" : "");
    } else {
        memset(plan, 0, sizeof *plan);
        if (parse_answer(cod_reply_get(r, 0, "Parts"), cod_reply_get(r, 0, "Moves"), plan) != 0) {
            plan_free(plan);
            snprintf(err, errlen, "tuple redistribution for epoch %lld: an answer CSCS cannot read", epoch);
        } else {
            rc = 1;
        }
    }
    cod_reply_free(r);
    if (rc < 0)
        return -1;
    char parts[512];
    plan_format_parts(plan->parts, plan->nparts, parts, sizeof parts);
    printf("# cod: redistribution for epoch %lld by the SKB's cscs_redistribute/5 in %.1f ms "
           "(%.1f ms after the upcall): parts %s, %zu moves\n",
           epoch, (wall_s() - t0) * 1e3, (wall_s() - heard_at) * 1e3, parts, plan->nmoves);
    fflush(stdout);
    g->applying_epoch = epoch;
    g->applying_heard_at = heard_at;
    g->applying_deadline_s = deadline_s;
    return rc;
}

void cod_glue_applied(struct cod_glue *g, int ok)
{
    if (!g || g->applying_epoch < 0)
        return;
    long long epoch = g->applying_epoch;
    g->applying_epoch = -1;
    if (!ok) {
        /* The engine still runs on its old cores: the RM takes them at its deadline. */
        printf("# cod: epoch %lld not acknowledged: the engine refused the plan\n", epoch);
        fflush(stdout);
        return;
    }
    if (cod_ack_allocation(g->c, g->name, epoch) != 0) {
        printf("# cod: ack of epoch %lld failed: %s\n", epoch, cod_errstr(g->c));
    } else {
        double now = wall_s(), since = now - g->applying_heard_at;
        printf("# cod: acked epoch %lld at wall %.3f, %.1f ms after the upcall", epoch, now, since * 1e3);
        if (g->applying_deadline_s > 0)
            printf(", %.1f ms before the RM's deadline", (g->applying_deadline_s - since) * 1e3);
        printf("\n");
    }
    fflush(stdout);
}

void cod_glue_close(struct cod_glue *g)
{
    if (!g)
        return;
    if (g->listening) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->listener, NULL);
    }
    if (g->c) {
        cod_deregister_task(g->c, g->name);
        cod_free(g->c);
    }
    free(g->cores);
    pthread_mutex_destroy(&g->mu);
    free(g);
}
