#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cpulist.h"

enum task { TASK_NONE, TASK_GENERATE, TASK_SCAN, TASK_MOVE_IN, TASK_EXIT };

/* Part of a move: a whole chunk handed over (same node), or tuples
 * [start, start + count) of a chunk copied by the receiving thread. */
struct piece {
    struct scan_thread *dst;
    struct chunk *chunk;
    size_t start, count;
    int whole;
};

struct scan_thread {
    struct engine *e;
    pthread_t th;
    int cpu, node;
    struct partition part;
    struct result_buf res;
    uint64_t seen;  /* the last phase this thread ran */
    int pin_rc;     /* pthread_setaffinity_np's answer */
    enum task task;
    /* TASK_GENERATE */
    uint64_t gen_first;
    size_t gen_count;
    /* TASK_MOVE_IN: the pieces to copy (those whose dst is this thread) */
    const struct piece *pieces;
    size_t npieces;
    /* outcome of the last task */
    int rc;
    double ms, cpu_ms;
    size_t updated;
};

struct engine {
    uint64_t seedh, nkeys;
    size_t ntuples;
    int bind;
    int *allowed;
    size_t nallowed;
    struct scan_thread **threads; /* in partition order */
    size_t nthreads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t phase;
    size_t running;
    const struct batch *batch;
};

static void run_task(struct scan_thread *t)
{
    struct engine *e = t->e;
    t->rc = 0;
    t->updated = 0;
    double t0 = now_s(), c0 = thread_cpu_s();
    switch (t->task) {
    case TASK_GENERATE:
        t->rc = partition_generate(&t->part, e->seedh, e->nkeys, t->gen_first, t->gen_count);
        break;
    case TASK_SCAN:
        t->updated = scan_partition(&t->part, e->batch, &t->res);
        t->rc = t->res.failed ? -1 : 0;
        break;
    case TASK_MOVE_IN:
        for (size_t k = 0; k < t->npieces && t->rc == 0; k++)
            if (t->pieces[k].dst == t && !t->pieces[k].whole)
                t->rc = partition_copy_in(&t->part, t->pieces[k].chunk, t->pieces[k].start,
                                          t->pieces[k].count);
        break;
    case TASK_NONE:
    case TASK_EXIT:
        break;
    }
    t->ms = (now_s() - t0) * 1e3;
    t->cpu_ms = (thread_cpu_s() - c0) * 1e3;
}

static void *scan_thread_main(void *arg)
{
    struct scan_thread *t = arg;
    struct engine *e = t->e;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(t->cpu, &set);
    t->pin_rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (t->seen == e->phase)
            pthread_cond_wait(&e->start, &e->mu);
        t->seen = e->phase;
        enum task task = t->task;
        pthread_mutex_unlock(&e->mu);
        run_task(t);
        pthread_mutex_lock(&e->mu);
        if (--e->running == 0)
            pthread_cond_signal(&e->done);
        if (task == TASK_EXIT)
            break;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Run one phase on every thread (each does its own task) and wait for all. */
static void run_phase(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->phase++;
    e->running = e->nthreads;
    pthread_cond_broadcast(&e->start);
    while (e->running > 0)
        pthread_cond_wait(&e->done, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

static void set_tasks(struct engine *e, enum task task)
{
    for (size_t i = 0; i < e->nthreads; i++)
        e->threads[i]->task = task;
}

/* A new scan thread for `cpu` with an empty partition, waiting for the
 * next phase, appended to e->threads (whose array has room). */
static int thread_start(struct engine *e, int cpu, char *err, size_t errlen)
{
    struct scan_thread *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    t->e = e;
    t->cpu = cpu;
    t->node = e->bind ? cpu_numa_node(cpu) : -1;
    partition_init(&t->part, t->node);
    pthread_mutex_lock(&e->mu);
    t->seen = e->phase;
    pthread_mutex_unlock(&e->mu);
    int rc = pthread_create(&t->th, NULL, scan_thread_main, t);
    if (rc != 0) {
        partition_free(&t->part);
        free(t);
        snprintf(err, errlen, "cannot start a scan thread: %s", strerror(rc));
        return -1;
    }
    e->threads[e->nthreads++] = t;
    return 0;
}

/* Stop and free the threads for which `stop[i]` is set, keeping the order
 * of the others. */
static void threads_stop(struct engine *e, const int *stop)
{
    for (size_t i = 0; i < e->nthreads; i++)
        e->threads[i]->task = stop[i] ? TASK_EXIT : TASK_NONE;
    run_phase(e);
    size_t k = 0;
    for (size_t i = 0; i < e->nthreads; i++) {
        struct scan_thread *t = e->threads[i];
        if (stop[i]) {
            pthread_join(t->th, NULL);
            partition_free(&t->part);
            result_buf_free(&t->res);
            free(t);
        } else {
            e->threads[k++] = t;
        }
    }
    e->nthreads = k;
}

static int check_cpus(const struct engine *e, const int *cpus, size_t n, char *err, size_t errlen)
{
    if (n == 0) {
        snprintf(err, errlen, "no cores given");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!cpulist_contains(e->allowed, e->nallowed, cpus[i])) {
            char allowed[256];
            cpulist_format(e->allowed, e->nallowed, allowed, sizeof allowed);
            snprintf(err, errlen, "CPU %d is not one this process may run on (%s)", cpus[i], allowed);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (cpus[j] == cpus[i]) {
                snprintf(err, errlen, "CPU %d is listed twice", cpus[i]);
                return -1;
            }
    }
    return 0;
}

/* After a phase that started threads: did they all pin themselves? */
static int check_pinned(struct engine *e, size_t first, char *err, size_t errlen)
{
    for (size_t i = first; i < e->nthreads; i++)
        if (e->threads[i]->pin_rc != 0) {
            snprintf(err, errlen, "cannot pin a scan thread to CPU %d: %s", e->threads[i]->cpu,
                     strerror(e->threads[i]->pin_rc));
            return -1;
        }
    return 0;
}

static int grow_thread_array(struct engine *e, size_t n)
{
    struct scan_thread **m = realloc(e->threads, n * sizeof *m);
    if (!m)
        return -1;
    e->threads = m;
    return 0;
}

int engine_create(const struct engine_config *cfg, struct engine **out, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->ntuples == 0) {
        snprintf(err, errlen, "the table needs at least one tuple");
        return -1;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    e->seedh = cscs_seed_hash(cfg->seed);
    e->nkeys = cscs_nkeys(cfg->ntuples);
    e->ntuples = cfg->ntuples;
    e->bind = !cfg->no_numa_binding;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->start, NULL);
    pthread_cond_init(&e->done, NULL);
    if (cpulist_allowed(&e->allowed, &e->nallowed) != 0) {
        snprintf(err, errlen, "cannot read this process's CPU affinity: %s", strerror(errno));
        goto fail;
    }
    if (check_cpus(e, cfg->cpus, cfg->ncpus, err, errlen) != 0)
        goto fail;
    if (grow_thread_array(e, cfg->ncpus) != 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    size_t first = 0;
    for (size_t i = 0; i < cfg->ncpus; i++) {
        size_t count = cfg->ntuples / cfg->ncpus + (i < cfg->ntuples % cfg->ncpus);
        if (thread_start(e, cfg->cpus[i], err, errlen) != 0)
            goto fail;
        e->threads[i]->gen_first = first;
        e->threads[i]->gen_count = count;
        first += count;
    }
    set_tasks(e, TASK_NONE);
    run_phase(e);
    if (check_pinned(e, 0, err, errlen) != 0)
        goto fail;
    /* Each thread generates its own partition, on its own core. */
    set_tasks(e, TASK_GENERATE);
    run_phase(e);
    for (size_t i = 0; i < e->nthreads; i++)
        if (e->threads[i]->rc != 0) {
            snprintf(err, errlen, "out of memory generating the partition of CPU %d",
                     e->threads[i]->cpu);
            goto fail;
        }
    *out = e;
    return 0;
fail:
    engine_destroy(e);
    return -1;
}

void engine_destroy(struct engine *e)
{
    if (!e)
        return;
    if (e->nthreads) {
        int *stop = malloc(e->nthreads * sizeof *stop);
        if (stop) {
            for (size_t i = 0; i < e->nthreads; i++)
                stop[i] = 1;
            threads_stop(e, stop);
            free(stop);
        }
    }
    free(e->threads);
    free(e->allowed);
    pthread_cond_destroy(&e->done);
    pthread_cond_destroy(&e->start);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int engine_run_batch(struct engine *e, struct batch *b, struct batch_output *out,
                     struct batch_stats *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    st->cores = e->nthreads;
    double t0 = now_s();
    if (batch_index(b) != 0) {
        snprintf(err, errlen, "out of memory indexing a batch of %zu requests", b->nq + b->nu);
        return -1;
    }
    double t1 = now_s();
    st->index_ms = (t1 - t0) * 1e3;
    e->batch = b;
    set_tasks(e, TASK_SCAN);
    run_phase(e);
    e->batch = NULL;
    st->scan_min_ms = 1e300;
    for (size_t i = 0; i < e->nthreads; i++) {
        struct scan_thread *t = e->threads[i];
        if (t->ms > st->scan_max_ms)
            st->scan_max_ms = t->ms;
        if (t->ms < st->scan_min_ms)
            st->scan_min_ms = t->ms;
        if (t->cpu_ms > st->scan_max_cpu_ms)
            st->scan_max_cpu_ms = t->cpu_ms;
        st->updated += t->updated;
    }
    /* The merge step reads the threads' result buffers in place. */
    struct result_buf *bufs = malloc(e->nthreads * sizeof *bufs);
    if (!bufs) {
        snprintf(err, errlen, "out of memory merging results");
        return -1;
    }
    for (size_t i = 0; i < e->nthreads; i++)
        bufs[i] = e->threads[i]->res;
    double t2 = now_s();
    int rc = merge_results(bufs, e->nthreads, b->nq, out);
    free(bufs);
    st->merge_ms = (now_s() - t2) * 1e3;
    if (rc != 0) {
        snprintf(err, errlen, "out of memory gathering the answers of batch %llu",
                 (unsigned long long)b->seq);
        return -1;
    }
    st->matches = out->nrows;
    return 0;
}

int engine_layout(const struct engine *e, struct plan_part **parts, size_t *n)
{
    *parts = malloc((e->nthreads ? e->nthreads : 1) * sizeof **parts);
    if (!*parts)
        return -1;
    for (size_t i = 0; i < e->nthreads; i++)
        (*parts)[i] = (struct plan_part){ e->threads[i]->cpu, e->threads[i]->part.n };
    *n = e->nthreads;
    return 0;
}

size_t engine_ncores(const struct engine *e)
{
    return e->nthreads;
}

uint64_t engine_nkeys(const struct engine *e)
{
    return e->nkeys;
}

size_t engine_ntuples(const struct engine *e)
{
    return e->ntuples;
}

static struct scan_thread *thread_of(const struct engine *e, int cpu)
{
    for (size_t i = 0; i < e->nthreads; i++)
        if (e->threads[i]->cpu == cpu)
            return e->threads[i];
    return NULL;
}

static size_t plan_target(const struct plan *p, int cpu, int *found)
{
    for (size_t i = 0; i < p->nparts; i++)
        if (p->parts[i].cpu == cpu) {
            *found = 1;
            return p->parts[i].tuples;
        }
    *found = 0;
    return 0;
}

/* Cut the plan's moves into pieces: each source gives from the end of its
 * chunk list backwards, whole chunks where they fit in the move and stay on
 * their node, else the tail of a chunk.  Nothing changes yet.  Returns the
 * number of pieces (at most nmoves + total chunks). */
static size_t plan_pieces(struct engine *e, const struct plan *p, struct piece *out)
{
    size_t n = 0;
    for (size_t i = 0; i < e->nthreads; i++) {
        struct scan_thread *src = e->threads[i];
        size_t ci = src->part.nchunks, left = 0; /* unassigned tuples of chunk ci - 1 */
        for (size_t m = 0; m < p->nmoves; m++) {
            if (p->moves[m].from != src->cpu)
                continue;
            struct scan_thread *dst = thread_of(e, p->moves[m].to);
            size_t want = p->moves[m].tuples;
            while (want > 0) {
                if (left == 0) {
                    ci--; /* plan_check vouched that the source holds enough */
                    left = src->part.chunks[ci]->n;
                }
                struct chunk *c = src->part.chunks[ci];
                size_t take = left < want ? left : want;
                int whole = take == c->n && c->node == dst->part.node;
                out[n++] = (struct piece){ dst, c, left - take, take, whole };
                left -= take;
                want -= take;
            }
        }
    }
    return n;
}

static int piece_whole_chunk(const struct piece *pieces, size_t n, const struct chunk *c)
{
    for (size_t k = 0; k < n; k++)
        if (pieces[k].whole && pieces[k].chunk == c)
            return 1;
    return 0;
}

/* Drop a source's tuples beyond `keep`: chunks handed over whole are
 * detached, copied ones freed, a partly given chunk shortened. */
static void release_tail(struct partition *part, size_t keep, const struct piece *pieces, size_t n)
{
    while (part->n > keep) {
        struct chunk *c = part->chunks[part->nchunks - 1];
        size_t drop = part->n - keep;
        if (drop < c->n) {
            c->n -= drop;
            part->n -= drop;
        } else {
            part->nchunks--;
            part->n -= c->n;
            if (!piece_whole_chunk(pieces, n, c))
                chunk_free(c);
        }
    }
}

/* What a reconfiguration prepares before anything moves, freed by the caller. */
struct moves {
    struct piece *pieces; /* the plan's moves cut into pieces (plan_pieces) */
    size_t npieces;
    size_t *before;       /* each thread's tuple count before the copies, to undo them */
    int *stop;            /* the threads to stop afterwards: their cores are not in the plan */
};

/* The plan fits the current layout (plan_check) and its cores are ones this process may
 * run on, each listed once. */
static int check_plan(struct engine *e, const struct plan_part *cur, size_t ncur, const struct plan *p,
                      char *err, size_t errlen)
{
    if (plan_check(cur, ncur, p, err, errlen) != 0)
        return -1;
    int *pcpus = malloc(p->nparts * sizeof *pcpus);
    if (!pcpus) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < p->nparts; i++)
        pcpus[i] = p->parts[i].cpu;
    int rc = check_cpus(e, pcpus, p->nparts, err, errlen);
    free(pcpus);
    return rc;
}

/* Step 1: scan threads for the plan's new cores, with empty partitions, each pinned to its
 * core.  The thread array has room for them. */
static int start_new_threads(struct engine *e, const struct plan *p, size_t old_n, struct reconfig_stats *st,
                             char *err, size_t errlen)
{
    for (size_t i = 0; i < p->nparts; i++)
        if (!thread_of(e, p->parts[i].cpu)) {
            if (thread_start(e, p->parts[i].cpu, err, errlen) != 0)
                return -1;
            st->threads_started++;
        }
    set_tasks(e, TASK_NONE);
    run_phase(e);
    return check_pinned(e, old_n, err, errlen);
}

/* Step 2: the pieces, and room in each receiving partition for the chunk pointers it gets
 * whole, so that handing them over after the copies cannot fail; each thread's tuple count
 * noted. */
static int prepare_moves(struct engine *e, const struct plan *p, struct moves *mv, char *err, size_t errlen)
{
    size_t nchunks = 0;
    for (size_t i = 0; i < e->nthreads; i++)
        nchunks += e->threads[i]->part.nchunks;
    mv->pieces = calloc(p->nmoves + nchunks + 1, sizeof *mv->pieces);
    mv->before = calloc(e->nthreads, sizeof *mv->before);
    mv->stop = calloc(e->nthreads, sizeof *mv->stop);
    if (!mv->pieces || !mv->before || !mv->stop) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    mv->npieces = plan_pieces(e, p, mv->pieces);
    for (size_t i = 0; i < e->nthreads; i++) {
        struct partition *part = &e->threads[i]->part;
        size_t whole = 0;
        for (size_t k = 0; k < mv->npieces; k++)
            whole += mv->pieces[k].whole && mv->pieces[k].dst == e->threads[i];
        if (part->nchunks + whole > part->cap_chunks) {
            struct chunk **m = realloc(part->chunks, (part->nchunks + whole) * sizeof *m);
            if (!m) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            part->chunks = m;
            part->cap_chunks = part->nchunks + whole;
        }
        mv->before[i] = part->n;
    }
    return 0;
}

/* Step 3: each receiving thread copies its pieces (partial chunks, other nodes) onto its own
 * core and node, from sources that stay read-only meanwhile.  On failure every partition is
 * cut back to what it held before. */
static int copy_pieces(struct engine *e, const struct moves *mv, char *err, size_t errlen)
{
    for (size_t i = 0; i < e->nthreads; i++) {
        struct scan_thread *t = e->threads[i];
        t->task = TASK_MOVE_IN;
        t->pieces = mv->pieces;
        t->npieces = mv->npieces;
    }
    run_phase(e);
    for (size_t i = 0; i < e->nthreads; i++)
        if (e->threads[i]->rc != 0) {
            for (size_t k = 0; k < e->nthreads; k++)
                partition_truncate(&e->threads[k]->part, mv->before[k]);
            snprintf(err, errlen, "out of memory copying tuples to CPU %d's NUMA node %d",
                     e->threads[i]->cpu, e->threads[i]->node);
            return -1;
        }
    return 0;
}

/* Step 4, which cannot fail: whole chunks change hands, the sources give up what they gave,
 * the lost cores' threads stop. */
static void hand_over(struct engine *e, const struct plan *p, struct moves *mv, struct reconfig_stats *st)
{
    for (size_t k = 0; k < mv->npieces; k++)
        if (mv->pieces[k].whole) {
            partition_adopt(&mv->pieces[k].dst->part, mv->pieces[k].chunk);
            st->chunks_handed_over++;
        }
    for (size_t m = 0; m < p->nmoves; m++)
        st->tuples_moved += p->moves[m].tuples;
    for (size_t i = 0; i < e->nthreads; i++) {
        struct scan_thread *t = e->threads[i];
        int found;
        size_t want = plan_target(p, t->cpu, &found);
        int gives = 0;
        for (size_t m = 0; m < p->nmoves; m++)
            gives |= p->moves[m].from == t->cpu;
        if (gives)
            release_tail(&t->part, found ? want : 0, mv->pieces, mv->npieces);
        if (!found) {
            mv->stop[i] = 1;
            st->threads_stopped++;
        }
    }
    threads_stop(e, mv->stop);
}

/* Step 5: the scan threads in the plan's order. */
static void order_as_plan(struct engine *e, const struct plan *p)
{
    for (size_t i = 0; i < p->nparts; i++) {
        struct scan_thread *t = thread_of(e, p->parts[i].cpu);
        for (size_t k = i; k < e->nthreads; k++)
            if (e->threads[k] == t) {
                e->threads[k] = e->threads[i];
                e->threads[i] = t;
            }
    }
}

/* Step 6: every remaining thread pinned to its core again: whoever changed the cores (a
 * resource manager widening the process's CPUs) may have widened its mask too.  A failure
 * here is not fatal: the thread still runs, only less precisely placed. */
static void pin_again(struct engine *e)
{
    for (size_t i = 0; i < e->nthreads; i++) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(e->threads[i]->cpu, &set);
        pthread_setaffinity_np(e->threads[i]->th, sizeof set, &set);
    }
}

/* Undoing a plan that failed before anything moved: the threads started for it (those from
 * old_n on) stop. */
static void stop_threads_started(struct engine *e, size_t old_n)
{
    if (e->nthreads > old_n) {
        int *drop = calloc(e->nthreads, sizeof *drop);
        if (drop) {
            for (size_t i = old_n; i < e->nthreads; i++)
                drop[i] = 1;
            threads_stop(e, drop);
            free(drop);
        }
    }
}

int engine_apply_plan(struct engine *e, const struct plan *p, struct reconfig_stats *st,
                      char *err, size_t errlen)
{
    double t0 = now_s();
    memset(st, 0, sizeof *st);
    struct plan_part *cur = NULL;
    size_t ncur = 0, old_n = e->nthreads;
    struct moves mv = { 0 };
    int rc = -1;
    if (engine_layout(e, &cur, &ncur) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (check_plan(e, cur, ncur, p, err, errlen) != 0)
        goto out;
    if (grow_thread_array(e, e->nthreads + p->nparts) != 0) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    if (start_new_threads(e, p, old_n, st, err, errlen) != 0 || prepare_moves(e, p, &mv, err, errlen) != 0 ||
        copy_pieces(e, &mv, err, errlen) != 0) {
        stop_threads_started(e, old_n); /* nothing moved */
        goto out;
    }
    hand_over(e, p, &mv, st);
    order_as_plan(e, p);
    pin_again(e);
    rc = 0;
out:
    free(cur);
    free(mv.pieces);
    free(mv.before);
    free(mv.stop);
    st->ms = (now_s() - t0) * 1e3;
    return rc;
}

int engine_set_cores(struct engine *e, const int *cpus, size_t n, struct reconfig_stats *st,
                     char *err, size_t errlen)
{
    struct plan_part *cur;
    size_t ncur;
    struct plan p;
    if (engine_layout(e, &cur, &ncur) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = plan_even(cur, ncur, cpus, n, &p, err, errlen);
    free(cur);
    if (rc != 0)
        return -1;
    rc = engine_apply_plan(e, &p, st, err, errlen);
    plan_free(&p);
    return rc;
}
