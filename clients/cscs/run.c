/* `cscs run`: input queue, closed-loop load generator, the coordinator's
 * loop of scan phases, and the per-batch report. */
#include "run.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "clock.h"
#include "cod_glue.h"
#include "control.h"
#include "cpulist.h"
#include "engine.h"

#define ERRLEN 512

/* ---- the input queue: requests wait here to be batched ---------------- */

struct input_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct query *q;
    size_t nq, cap_q;
    struct update *u;
    size_t nu, cap_u;
    int closed;
};

static int reserve(void **mem, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *m = realloc(*mem, c * elem);
    if (!m)
        return -1;
    *mem = m;
    *cap = c;
    return 0;
}

static int iq_push(struct input_queue *iq, const struct query *q, size_t nq,
                   const struct update *u, size_t nu)
{
    int rc = 0;
    pthread_mutex_lock(&iq->mu);
    if (reserve((void **)&iq->q, &iq->cap_q, iq->nq + nq, sizeof *q) != 0 ||
        reserve((void **)&iq->u, &iq->cap_u, iq->nu + nu, sizeof *u) != 0) {
        rc = -1;
    } else {
        memcpy(iq->q + iq->nq, q, nq * sizeof *q);
        iq->nq += nq;
        memcpy(iq->u + iq->nu, u, nu * sizeof *u);
        iq->nu += nu;
        pthread_cond_broadcast(&iq->cv);
    }
    pthread_mutex_unlock(&iq->mu);
    return rc;
}

/* The next batch: up to maxq queries and maxu updates, oldest first, once
 * both quotas are there (or the queue is closed).  Returns 0 with a batch,
 * 1 when closed and empty, -1 out of memory. */
static int iq_take(struct input_queue *iq, size_t maxq, size_t maxu, struct batch *b)
{
    int rc = 0;
    batch_clear(b);
    pthread_mutex_lock(&iq->mu);
    while (!iq->closed && (iq->nq < maxq || iq->nu < maxu))
        pthread_cond_wait(&iq->cv, &iq->mu);
    size_t nq = iq->nq < maxq ? iq->nq : maxq, nu = iq->nu < maxu ? iq->nu : maxu;
    if (nq + nu == 0) {
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < nq && rc == 0; i++)
        rc = batch_add_query(b, &iq->q[i]);
    for (size_t i = 0; i < nu && rc == 0; i++)
        rc = batch_add_update(b, &iq->u[i]);
    memmove(iq->q, iq->q + nq, (iq->nq - nq) * sizeof *iq->q);
    iq->nq -= nq;
    memmove(iq->u, iq->u + nu, (iq->nu - nu) * sizeof *iq->u);
    iq->nu -= nu;
out:
    pthread_mutex_unlock(&iq->mu);
    return rc;
}

static void iq_close(struct input_queue *iq)
{
    pthread_mutex_lock(&iq->mu);
    iq->closed = 1;
    pthread_cond_broadcast(&iq->cv);
    pthread_mutex_unlock(&iq->mu);
}

/* ---- the output: one answered batch at a time (closed loop) ----------- */

struct mailbox {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int full, closed;
    uint64_t seq;
    const struct batch_output *out;
    char cpus[256];
};

/* ---- the closed-loop load generator ------------------------------------ */

struct loadgen {
    pthread_t th;
    struct input_queue *iq;
    struct mailbox *mb;
    uint64_t rng, nkeys;
    size_t nq, nu;
    struct query *q;
    struct update *u;
    FILE *results;
    double think_ms;  /* pause between an answer and the next batch (0: a closed loop without one) */
    int failed;
};

static uint64_t next_random(uint64_t *state)
{
    *state += 0x9E3779B97F4A7C15ULL;
    return cscs_splitmix64(*state - 0x9E3779B97F4A7C15ULL);
}

static void write_row(FILE *f, const uint8_t *row)
{
    fputc('R', f);
    for (int a = 0; a < CSCS_NATTR; a++) {
        const struct cscs_attr *at = &cscs_schema[a];
        const uint8_t *v = row + at->offset;
        if (at->type == CSCS_I32) {
            int32_t x;
            memcpy(&x, v, sizeof x);
            fprintf(f, " %d", (int)x);
        } else if (at->type == CSCS_I64) {
            int64_t x;
            memcpy(&x, v, sizeof x);
            fprintf(f, " %lld", (long long)x);
        } else {
            fprintf(f, " %.*s", (int)at->width, (const char *)v);
        }
    }
    fputc('\n', f);
}

/* The requests the generator sent and the answers it got back. */
static void write_results(struct loadgen *g, uint64_t seq, const char *cpus,
                          const struct batch_output *out)
{
    FILE *f = g->results;
    fprintf(f, "B %llu %s\n", (unsigned long long)seq, cpus);
    for (size_t i = 0; i < g->nu; i++)
        fprintf(f, "U %lld %d %lld\n", (long long)g->u[i].key, g->u[i].attr, (long long)g->u[i].value);
    for (size_t i = 0; i < g->nq; i++) {
        size_t lo = out->offset[i], hi = out->offset[i + 1];
        fprintf(f, "Q %lld %zu\n", (long long)g->q[i].key, hi - lo);
        for (size_t r = lo; r < hi; r++)
            write_row(f, out->rows + r * CSCS_TUPLE_BYTES);
    }
}

static void *loadgen_main(void *arg)
{
    struct loadgen *g = arg;
    struct mailbox *mb = g->mb;
    for (uint64_t seq = 1;; seq++) {
        double t = now_s();
        for (size_t i = 0; i < g->nq; i++)
            g->q[i] = (struct query){ (int64_t)(next_random(&g->rng) % g->nkeys), t };
        for (size_t i = 0; i < g->nu; i++) {
            struct update *u = &g->u[i];
            u->key = (int64_t)(next_random(&g->rng) % g->nkeys);
            u->attr = CSCS_FIRST_UPDATABLE +
                      (int)(next_random(&g->rng) % (CSCS_LAST_UPDATABLE - CSCS_FIRST_UPDATABLE + 1));
            uint64_t v = next_random(&g->rng);
            u->value = cscs_schema[u->attr].type == CSCS_I32 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
            u->submitted = t;
        }
        if (iq_push(g->iq, g->q, g->nq, g->u, g->nu) != 0) {
            g->failed = 1;
            break;
        }
        pthread_mutex_lock(&mb->mu);
        while (!mb->full && !mb->closed)
            pthread_cond_wait(&mb->cv, &mb->mu);
        if (!mb->full) {
            pthread_mutex_unlock(&mb->mu);
            break;
        }
        if (mb->seq != seq || mb->out->nq != g->nq) {
            fprintf(stderr, "cscs: bug: answer %llu does not match request batch %llu\n",
                    (unsigned long long)mb->seq, (unsigned long long)seq);
            g->failed = 1;
        } else if (g->results) {
            write_results(g, seq, mb->cpus, mb->out);
        }
        mb->full = 0;
        pthread_cond_broadcast(&mb->cv);
        pthread_mutex_unlock(&mb->mu);
        if (g->failed)
            break;
        if (g->think_ms > 0) {
            struct timespec ts = { (time_t)(g->think_ms / 1e3), (long)(fmod(g->think_ms, 1e3) * 1e6) };
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
    }
    /* Leaving (stopped or failed): whoever waits on us must not wait on. */
    iq_close(g->iq);
    pthread_mutex_lock(&mb->mu);
    mb->full = 0;
    mb->closed = 1;
    pthread_cond_broadcast(&mb->cv);
    pthread_mutex_unlock(&mb->mu);
    return NULL;
}

/* ---- reporting ---------------------------------------------------------- */

struct summary {
    double *rt_ms;
    size_t n, cap;
    size_t requests, queries, sla_met, reconfigs;
    double reconfig_ms;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)ceil(p / 100.0 * (double)n);
    return sorted[i ? i - 1 : 0];
}

static void print_summary(const struct summary *s, double elapsed, double sla_ms)
{
    double *sorted = malloc((s->n ? s->n : 1) * sizeof *sorted);
    double mean = 0;
    if (!sorted)
        return;
    /* A run stopped before batch 1 has no samples and s->rt_ms is NULL, which memcpy may
     * not be given even for no bytes. */
    if (s->n > 0) {
        memcpy(sorted, s->rt_ms, s->n * sizeof *sorted);
        qsort(sorted, s->n, sizeof *sorted, cmp_double);
    }
    for (size_t i = 0; i < s->n; i++)
        mean += sorted[i] / (double)s->n;
    double per_s = elapsed > 0 ? 1.0 / elapsed : 0; /* a run stopped at once: 0/s, not NaN */
    printf("summary: %zu batches, %zu requests (%zu queries) in %.2f s: %.0f requests/s, %.0f queries/s\n",
           s->n, s->requests, s->queries, elapsed, (double)s->requests * per_s, (double)s->queries * per_s);
    if (s->n == 0)
        printf("summary: response time ms: no batch ran\n");
    else
        printf("summary: response time ms: mean %.1f  p50 %.1f  p95 %.1f  max %.1f\n", mean,
               percentile(sorted, s->n, 50), percentile(sorted, s->n, 95), sorted[s->n - 1]);
    if (sla_ms > 0)
        printf("summary: SLA %.0f ms met by %zu of %zu batches\n", sla_ms, s->sla_met, s->n);
    if (s->reconfigs)
        printf("summary: %zu reconfigurations, %.1f ms in all\n", s->reconfigs, s->reconfig_ms);
    free(sorted);
}

/* ---- the coordinator ---------------------------------------------------- */

static int apply_command(struct engine *e, struct control_cmd *cmd, struct reconfig_stats *rs,
                         char *err, size_t errlen)
{
    if (cmd->kind == CONTROL_CORES)
        return engine_set_cores(e, cmd->cpus, cmd->ncpus, rs, err, errlen);
    return engine_apply_plan(e, &cmd->plan, rs, err, errlen);
}

static void layout_text(struct engine *e, char *buf, size_t len)
{
    struct plan_part *parts;
    size_t n;
    if (engine_layout(e, &parts, &n) != 0) {
        snprintf(buf, len, "?");
        return;
    }
    int *cpus = malloc((n ? n : 1) * sizeof *cpus);
    if (cpus) {
        for (size_t i = 0; i < n; i++)
            cpus[i] = parts[i].cpu;
        /* cpulist_format wants ascending CPUs. */
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && cpus[j - 1] > cpus[j]; j--) {
                int t = cpus[j];
                cpus[j] = cpus[j - 1];
                cpus[j - 1] = t;
            }
        cpulist_format(cpus, n, buf, len);
    }
    free(cpus);
    free(parts);
}

/* SIGTERM and SIGINT end the run after the batch in progress, with the summary (and, under
 * COD, the task deregistered), as --seconds does. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* Everything one run holds, shared by the steps below; run_release frees whatever the
 * run got to. */
struct run {
    const struct run_options *o;
    char err[ERRLEN];           /* why the run failed, for the last message */
    int *allowed, *glue_cpus;
    size_t nallowed, nglue;
    const int *cpus;            /* the scan threads' CPUs at the start */
    size_t ncpus;
    struct engine *e;
    struct control *ctl;
    struct cod_glue *glue;
    FILE *csv, *results;
    struct input_queue iq;
    struct mailbox mb;
    struct loadgen g;
    int gen_started;
    struct batch b;
    struct batch_output out;
    struct summary sum;
    double start, prev_done;    /* the first batch's start, the latest batch's end */
};

/* COD (when --socket is given), the starting CPUs, the control hooks and the output files. */
static int run_open(struct run *r)
{
    const struct run_options *o = r->o;
    struct glue_config gc = {
        .socket = o->socket_path, .name = o->cod_name, .cost_fn_path = o->cost_fn_path, .ntuples = o->tuples,
        .tuple_bytes = CSCS_TUPLE_BYTES, .batch_queries = o->batch_queries,
        .batch_updates = o->batch_updates, .sla_ms = o->sla_ms,
        .max_cores = (int)(o->max_cores && o->max_cores < r->nallowed ? o->max_cores : r->nallowed),
    };
    if (cod_glue_open(&gc, &r->glue, &r->glue_cpus, &r->nglue, r->err, sizeof r->err) != 0)
        return -1;
    r->cpus = r->allowed;
    r->ncpus = r->nallowed;
    if (r->glue) {
        r->cpus = r->glue_cpus;
        r->ncpus = r->nglue;
    } else if (o->cpus) {
        r->cpus = o->cpus;
        r->ncpus = o->ncpus;
    }
    if (!o->naive && control_open(o->schedule, o->control_path, &r->ctl, r->err, sizeof r->err) != 0)
        return -1;
    if (o->csv_path && !(r->csv = fopen(o->csv_path, "w"))) {
        snprintf(r->err, sizeof r->err, "--csv %s: %s", o->csv_path, strerror(errno));
        return -1;
    }
    if (o->results_path && !(r->results = fopen(o->results_path, "w"))) {
        snprintf(r->err, sizeof r->err, "--results %s: %s", o->results_path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The engine with its table, between the header lines that say what was built. */
static int run_create_engine(struct run *r)
{
    const struct run_options *o = r->o;
    char cpus_text[256];
    cpulist_format(r->cpus, r->ncpus, cpus_text, sizeof cpus_text);
    printf("# cscs run: %zu tuples x %d B (%.2f GB), %d attributes, seed %llu; "
           "batches of %zu queries + %zu updates; cores %s; %s\n",
           o->tuples, CSCS_TUPLE_BYTES, (double)o->tuples * CSCS_TUPLE_BYTES / 1e9, CSCS_NATTR,
           (unsigned long long)o->seed, o->batch_queries, o->batch_updates, cpus_text,
           o->naive ? "naive (no reaction to anything)" : r->glue ? "COD" : "standalone");
    fflush(stdout);
    double t0 = now_s();
    struct engine_config ec = { .seed = o->seed, .ntuples = o->tuples, .cpus = r->cpus, .ncpus = r->ncpus,
                                .no_numa_binding = o->no_numa_binding };
    if (engine_create(&ec, &r->e, r->err, sizeof r->err) != 0)
        return -1;
    printf("# table generated in %.2f s by %zu scan threads; memory %s\n", now_s() - t0, r->ncpus,
           o->no_numa_binding ? "on the default policy"
                              : numa_binding_available() ? "bound to each core's NUMA node"
                                                         : "unbound (no NUMA support here)");
    if (r->csv)
        fprintf(r->csv, "batch,time_s,cores,cpus,queries,updates,rt_ms,index_ms,scan_max_ms,"
                        "scan_min_ms,scan_max_cpu_ms,merge_ms,reconfig_ms,matches,throughput_rps,sla_met\n");
    printf("%7s %9s %5s %10s %10s %10s %12s\n", "batch", "time_s", "cores", "rt_ms", "scan_ms",
           "merge_ms", "tput_req/s");
    fflush(stdout);
    return 0;
}

/* The closed-loop load generator's thread (its request buffers first). */
static int run_start_loadgen(struct run *r)
{
    const struct run_options *o = r->o;
    r->g = (struct loadgen){ .iq = &r->iq, .mb = &r->mb, .rng = cscs_seed_hash(o->seed ^ 0x5EEDULL),
                             .nkeys = engine_nkeys(r->e), .nq = o->batch_queries, .nu = o->batch_updates,
                             .results = r->results, .think_ms = o->think_ms };
    r->g.q = calloc(o->batch_queries + 1, sizeof *r->g.q);
    r->g.u = calloc(o->batch_updates + 1, sizeof *r->g.u);
    if (!r->g.q || !r->g.u) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    int rc = pthread_create(&r->g.th, NULL, loadgen_main, &r->g);
    if (rc != 0) {
        snprintf(r->err, sizeof r->err, "cannot start the load generator: %s", strerror(rc));
        return -1;
    }
    r->gen_started = 1;
    return 0;
}

static void catch_stop_signals(void)
{
    struct sigaction sa = { 0 };
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* The next change of cores due before batch seq: from the control hooks (a refused line
 * is reported and the next one read), else from a COD upcall.  Returns 1 with *cmd, 0 when
 * none is due, -1 on failure (r->err set). */
static int next_command(struct run *r, uint64_t seq, struct control_cmd *cmd)
{
    char cerr[ERRLEN];
    int due;
    while ((due = control_poll(r->ctl, seq, now_s() - r->start, cmd, cerr, sizeof cerr)) < 0)
        printf("# control: refused: %s\n", cerr);
    if (due == 0 && r->glue) {
        struct plan_part *cur = NULL;
        size_t ncur = 0;
        if (engine_layout(r->e, &cur, &ncur) != 0) {
            snprintf(r->err, sizeof r->err, "out of memory");
            return -1;
        }
        due = cod_glue_poll(r->glue, cur, ncur, &cmd->plan, cerr, sizeof cerr);
        free(cur);
        if (due < 0) {
            printf("# cod: %s\n", cerr);
            due = 0;
        } else if (due > 0) {
            cmd->kind = CONTROL_PLAN;
            snprintf(cmd->source, sizeof cmd->source, "COD upcall");
        }
    }
    return due;
}

/* A change of cores applied to the engine (COD told whether its plan was), and reported. */
static void reconfigure(struct run *r, uint64_t seq, struct control_cmd *cmd, double *reconfig_ms)
{
    char before[256], after[256], cerr[ERRLEN];
    struct reconfig_stats rs;
    layout_text(r->e, before, sizeof before);
    int arc = apply_command(r->e, cmd, &rs, cerr, sizeof cerr);
    if (r->glue && strcmp(cmd->source, "COD upcall") == 0)
        cod_glue_applied(r->glue, arc == 0);
    if (arc != 0) {
        printf("# reconfigure before batch %llu (%s): refused: %s\n",
               (unsigned long long)seq, cmd->source, cerr);
        return;
    }
    layout_text(r->e, after, sizeof after);
    printf("# reconfigure before batch %llu (%s): cores %s -> %s: %zu tuples moved "
           "(%zu chunks handed over whole), %zu scan threads started, %zu stopped, %.1f ms\n",
           (unsigned long long)seq, cmd->source, before, after, rs.tuples_moved,
           rs.chunks_handed_over, rs.threads_started, rs.threads_stopped, rs.ms);
    fflush(stdout);
    *reconfig_ms += rs.ms;
    r->sum.reconfigs++;
    r->sum.reconfig_ms += rs.ms;
}

/* Before the scan phase: every change of cores due, from COD or the hooks.  *stop when a
 * stop command came; -1 on failure. */
static int reconfigure_before_batch(struct run *r, uint64_t seq, double *reconfig_ms, int *stop)
{
    for (;;) {
        struct control_cmd cmd;
        int due = next_command(r, seq, &cmd);
        if (due < 0)
            return -1;
        if (due == 0)
            return 0;
        if (cmd.kind == CONTROL_STOP) {
            printf("# control: stop\n");
            *stop = 1;
            control_cmd_free(&cmd);
            return 0;
        }
        reconfigure(r, seq, &cmd, reconfig_ms);
        control_cmd_free(&cmd);
    }
}

/* When the batch's oldest request was submitted: its response time counts from there. */
static double oldest_submission(const struct batch *b)
{
    double submitted = INFINITY;
    for (size_t i = 0; i < b->nq; i++)
        submitted = fmin(submitted, b->q[i].submitted);
    for (size_t i = 0; i < b->nu; i++)
        submitted = fmin(submitted, b->u[i].submitted);
    return submitted;
}

/* The batch's line (and CSV row) and its share of the summary; cores_now gets the cores
 * it ran on. */
static void report_batch(struct run *r, uint64_t seq, double submitted, const struct batch_stats *bs,
                         double reconfig_ms, char *cores_now, size_t len)
{
    const struct run_options *o = r->o;
    const struct batch *b = &r->b;
    double done = now_s();
    double rt_ms = (done - submitted) * 1e3;
    double tput = (double)(b->nq + b->nu) / (done - r->prev_done);
    r->prev_done = done;
    int met = o->sla_ms <= 0 || rt_ms <= o->sla_ms;
    layout_text(r->e, cores_now, len);
    printf("%7llu %9.3f %5zu %10.2f %10.2f %10.2f %12.0f\n", (unsigned long long)seq,
           done - r->start, bs->cores, rt_ms, bs->scan_max_ms, bs->merge_ms, tput);
    fflush(stdout);
    if (r->csv)
        fprintf(r->csv, "%llu,%.6f,%zu,\"%s\",%zu,%zu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%zu,%.1f,%d\n",
                (unsigned long long)seq, done - r->start, bs->cores, cores_now, b->nq, b->nu, rt_ms,
                bs->index_ms, bs->scan_max_ms, bs->scan_min_ms, bs->scan_max_cpu_ms, bs->merge_ms,
                reconfig_ms, bs->matches, tput, met);
    if (reserve((void **)&r->sum.rt_ms, &r->sum.cap, r->sum.n + 1, sizeof *r->sum.rt_ms) == 0)
        r->sum.rt_ms[r->sum.n++] = rt_ms;
    r->sum.requests += b->nq + b->nu;
    r->sum.queries += b->nq;
    r->sum.sla_met += (size_t)met;
}

/* Hand the answer to the client and wait until it has it. */
static void hand_answer(struct run *r, uint64_t seq, const char *cores_now)
{
    struct mailbox *mb = &r->mb;
    pthread_mutex_lock(&mb->mu);
    mb->seq = seq;
    mb->out = &r->out;
    snprintf(mb->cpus, sizeof mb->cpus, "%s", cores_now);
    mb->full = 1;
    pthread_cond_broadcast(&mb->cv);
    while (mb->full)
        pthread_cond_wait(&mb->cv, &mb->mu);
    pthread_mutex_unlock(&mb->mu);
}

/* Batch seq: taken from the input queue, run, reported and answered. */
static int run_one_batch(struct run *r, uint64_t seq, double reconfig_ms)
{
    const struct run_options *o = r->o;
    int trc = iq_take(&r->iq, o->batch_queries, o->batch_updates, &r->b);
    if (trc != 0) {
        snprintf(r->err, sizeof r->err, trc > 0 ? "the load generator stopped" : "out of memory");
        return -1;
    }
    r->b.seq = seq;
    double submitted = oldest_submission(&r->b);
    struct batch_stats bs;
    if (engine_run_batch(r->e, &r->b, &r->out, &bs, r->err, sizeof r->err) != 0)
        return -1;
    char cores_now[256];
    report_batch(r, seq, submitted, &bs, reconfig_ms, cores_now, sizeof cores_now);
    hand_answer(r, seq, cores_now);
    if (r->g.failed) {
        snprintf(r->err, sizeof r->err, "the load generator failed");
        return -1;
    }
    return 0;
}

/* The coordinator's loop: batch after batch until --batches, --seconds, a signal or a stop
 * command ends the run.  -1 on failure. */
static int run_batches(struct run *r)
{
    const struct run_options *o = r->o;
    int stop = 0;
    for (uint64_t seq = 1; !stop; seq++) {
        if (o->max_batches && seq > o->max_batches)
            break;
        if (o->seconds > 0 && now_s() - r->start >= o->seconds)
            break;
        if (stop_requested) {
            printf("# stopped by a signal\n");
            break;
        }
        double reconfig_ms = 0;
        if (reconfigure_before_batch(r, seq, &reconfig_ms, &stop) != 0)
            return -1;
        if (stop)
            break;
        if (run_one_batch(r, seq, reconfig_ms) != 0)
            return -1;
    }
    return 0;
}

/* Everything the run holds released, the load generator told to end first; the output
 * files closed, a failure to write them turning success into 1.  Returns the exit status. */
static int run_release(struct run *r, int status)
{
    const struct run_options *o = r->o;
    if (r->gen_started) {
        pthread_mutex_lock(&r->mb.mu);
        r->mb.closed = 1;
        pthread_cond_broadcast(&r->mb.cv);
        pthread_mutex_unlock(&r->mb.mu);
        iq_close(&r->iq);
        pthread_join(r->g.th, NULL);
    }
    free(r->g.q);
    free(r->g.u);
    engine_destroy(r->e);
    control_close(r->ctl);
    cod_glue_close(r->glue);
    free(r->glue_cpus);
    free(r->allowed);
    batch_free(&r->b);
    batch_output_free(&r->out);
    free(r->sum.rt_ms);
    free(r->iq.q);
    free(r->iq.u);
    if (r->csv && fclose(r->csv) != 0 && status == 0) {
        fprintf(stderr, "cscs: writing --csv %s: %s\n", o->csv_path, strerror(errno));
        status = 1;
    }
    if (r->results && fclose(r->results) != 0 && status == 0) {
        fprintf(stderr, "cscs: writing --results %s: %s\n", o->results_path, strerror(errno));
        status = 1;
    }
    return status;
}

int cscs_run(const struct run_options *o)
{
    struct run r = {
        .o = o,
        .iq = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER },
        .mb = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER },
    };
    int status = 1;
    batch_init(&r.b);

    if (cpulist_allowed(&r.allowed, &r.nallowed) != 0) {
        fprintf(stderr, "cscs: cannot read this process's CPU affinity: %s\n", strerror(errno));
        return 1;
    }
    if (run_open(&r) != 0 || run_create_engine(&r) != 0 || run_start_loadgen(&r) != 0)
        goto fail;
    catch_stop_signals();
    r.start = now_s();
    r.prev_done = r.start;
    if (run_batches(&r) != 0)
        goto fail;
    print_summary(&r.sum, r.prev_done - r.start, o->sla_ms);
    status = 0;
    goto cleanup;
fail:
    fprintf(stderr, "cscs: %s\n", r.err);
    status = 1;
cleanup:
    return run_release(&r, status);
}
