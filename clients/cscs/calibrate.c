#include "calibrate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpulist.h"
#include "engine.h"

double calib_predict(const struct calib_fit *fit, size_t tuples, size_t cores, size_t requests)
{
    return (double)tuples / (double)cores / CSCS_COST_C_DIVISOR *
               (fit->a * (double)requests + fit->b) +
           fit->d * (double)requests;
}

static void fit_errors(const struct calib_point *pts, size_t n, struct calib_fit *fit)
{
    double ss = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double pred = calib_predict(fit, pts[i].tuples_per_core * pts[i].cores, pts[i].cores,
                                    pts[i].requests);
        double rel = (pred - pts[i].rt_ms) / pts[i].rt_ms;
        ss += rel * rel;
        if (fabs(rel) > mx)
            mx = fabs(rel);
    }
    fit->rms_rel_err = sqrt(ss / (double)n);
    fit->max_rel_err = mx;
}

/* The model's terms for one point, each divided by the measured response
 * time, so that least squares on them weighs every point by its relative
 * error: RT = a * x[0] + b * x[1] + d * x[2]. */
static void terms(const struct calib_point *p, double x[3])
{
    double per_core = (double)p->tuples_per_core / CSCS_COST_C_DIVISOR;
    x[0] = per_core * (double)p->requests / p->rt_ms;
    x[1] = per_core / p->rt_ms;
    x[2] = (double)p->requests / p->rt_ms;
}

/* Least squares over the constants in `mask` (the others 0) by Gaussian
 * elimination of the normal equations.  Returns -1 if singular. */
static int solve_subset(const struct calib_point *pts, size_t n, unsigned mask, double k[3])
{
    int idx[3], m = 0;
    for (int j = 0; j < 3; j++)
        if (mask & (1u << j))
            idx[m++] = j;
    /* Columns scaled to unit norm first: the terms differ by orders of
     * magnitude, and a singular system must be recognised as such. */
    double scale[3] = { 0, 0, 0 };
    for (size_t i = 0; i < n; i++) {
        double x[3];
        terms(&pts[i], x);
        for (int j = 0; j < 3; j++)
            scale[j] += x[j] * x[j];
    }
    for (int j = 0; j < 3; j++) {
        if (scale[j] == 0 && (mask & (1u << j)))
            return -1;
        scale[j] = sqrt(scale[j]);
    }
    double A[3][4] = { { 0 } };
    for (size_t i = 0; i < n; i++) {
        double x[3];
        terms(&pts[i], x);
        for (int r = 0; r < m; r++) {
            for (int c = 0; c < m; c++)
                A[r][c] += x[idx[r]] / scale[idx[r]] * x[idx[c]] / scale[idx[c]];
            A[r][m] += x[idx[r]] / scale[idx[r]];
        }
    }
    for (int c = 0; c < m; c++) {
        int piv = c;
        for (int r = c + 1; r < m; r++)
            if (fabs(A[r][c]) > fabs(A[piv][c]))
                piv = r;
        if (fabs(A[piv][c]) < 1e-9)
            return -1;
        for (int j = 0; j <= m; j++) {
            double t = A[c][j];
            A[c][j] = A[piv][j];
            A[piv][j] = t;
        }
        for (int r = 0; r < m; r++)
            if (r != c) {
                double f = A[r][c] / A[c][c];
                for (int j = c; j <= m; j++)
                    A[r][j] -= f * A[c][j];
            }
    }
    k[0] = k[1] = k[2] = 0;
    for (int r = 0; r < m; r++)
        k[idx[r]] = A[r][m] / A[r][r] / scale[idx[r]];
    return 0;
}

int calib_fit(const struct calib_point *pts, size_t n, enum cost_model model, struct calib_fit *fit)
{
    static const char *NAMES[3] = { "a", "b", "d" };
    unsigned all = model == MODEL_PAPER ? 3u : 7u;
    size_t nconst = model == MODEL_PAPER ? 2 : 3;
    memset(fit, 0, sizeof *fit);
    fit->model = model;
    if (n < nconst)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!(pts[i].rt_ms > 0))
            return -1;
    /* Every subset of the constants, the rest held at 0: the best fit with
     * no negative constant (a handful of subsets, so no need for NNLS). */
    int found = 0;
    for (unsigned mask = 1; mask <= all; mask++) {
        if ((mask & all) != mask)
            continue;
        double k[3];
        if (solve_subset(pts, n, mask, k) != 0 || k[0] < 0 || k[1] < 0 || k[2] < 0)
            continue;
        struct calib_fit f = { .model = model, .a = k[0], .b = k[1], .d = k[2] };
        fit_errors(pts, n, &f);
        if (!found || f.rms_rel_err < fit->rms_rel_err) {
            *fit = f;
            size_t len = 0;
            for (int j = 0; j < 3; j++)
                if ((all & (1u << j)) && !(mask & (1u << j)))
                    len += (size_t)snprintf(fit->held + len, sizeof fit->held - len, "%s%s",
                                            len ? "," : "", NAMES[j]);
            found = 1;
        }
    }
    return found ? 0 : -1;
}

void prolog_float(double x, char *buf, size_t len)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.12g", x);
    char *e = strpbrk(tmp, "eE");
    if (strchr(tmp, '.') || !strpbrk(tmp, "0123456789"))
        snprintf(buf, len, "%s", tmp);
    else if (e)
        snprintf(buf, len, "%.*s.0%s", (int)(e - tmp), tmp, e);
    else
        snprintf(buf, len, "%s.0", tmp);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *x, unsigned n)
{
    qsort(x, n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/* Median response time of `batches` batches of `requests` after one
 * warm-up: index + slowest scan + merge.  The scan counts with the slowest
 * thread's CPU time (cores of its own, as COD gives them) unless `wall`;
 * wall_ms is always the wall-clock response time. */
static int measure(struct engine *e, size_t requests, unsigned batches, int wall, uint64_t *rng,
                   struct calib_point *p, char *err, size_t errlen)
{
    struct batch b;
    struct batch_output out = { 0 };
    double *rt = calloc(2 * (size_t)batches, sizeof *rt), *wt = rt + batches;
    int rc = -1;
    batch_init(&b);
    if (!rt) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t nu = requests / 5, nq = requests - nu;
    for (unsigned i = 0; i <= batches; i++) {
        batch_clear(&b);
        for (size_t k = 0; k < nq; k++) {
            *rng = cscs_splitmix64(*rng);
            struct query q = { (int64_t)(*rng % engine_nkeys(e)), 0 };
            if (batch_add_query(&b, &q) != 0)
                goto out;
        }
        for (size_t k = 0; k < nu; k++) {
            *rng = cscs_splitmix64(*rng);
            struct update u = { (int64_t)(*rng % engine_nkeys(e)), CSCS_FIRST_UPDATABLE, (int64_t)k, 0 };
            if (batch_add_update(&b, &u) != 0)
                goto out;
        }
        struct batch_stats st;
        if (engine_run_batch(e, &b, &out, &st, err, errlen) != 0)
            goto out;
        if (i > 0) {
            wt[i - 1] = st.index_ms + st.scan_max_ms + st.merge_ms;
            rt[i - 1] = wall ? wt[i - 1] : st.index_ms + st.scan_max_cpu_ms + st.merge_ms;
        }
    }
    p->rt_ms = median_of(rt, batches);
    p->wall_ms = median_of(wt, batches);
    rc = 0;
out:
    if (rc != 0 && !err[0])
        snprintf(err, errlen, "out of memory building a batch");
    free(rt);
    batch_free(&b);
    batch_output_free(&out);
    return rc;
}

static int write_cost_fn(FILE *f, const struct calib_fit *fit, const struct calib_point *pts,
                         size_t n, int wall)
{
    char host[128] = "this machine", when[64] = "", a[64], b[64], d[64];
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    size_t kmax = 0, tmin = SIZE_MAX, tmax = 0, rmin = SIZE_MAX, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        kmax = pts[i].cores > kmax ? pts[i].cores : kmax;
        tmin = pts[i].tuples_per_core < tmin ? pts[i].tuples_per_core : tmin;
        tmax = pts[i].tuples_per_core > tmax ? pts[i].tuples_per_core : tmax;
        rmin = pts[i].requests < rmin ? pts[i].requests : rmin;
        rmax = pts[i].requests > rmax ? pts[i].requests : rmax;
    }
    prolog_float(fit->a, a, sizeof a);
    prolog_float(fit->b, b, sizeof b);
    prolog_float(fit->d, d, sizeof d);
    fprintf(f,
            "%% CSCS cost function (COD paper, Section 4.4), fitted by `cscs calibrate`\n"
            "%% on %s at %s from %zu points: 1..%zu cores, %zu..%zu tuples per core,\n"
            "%% %zu..%zu requests per batch.\n",
            host, when, n, kmax, tmin, tmax, rmin, rmax);
    if (fit->model == MODEL_PAPER)
        fprintf(f, "%% RT[ms] = c * tuples / cores * (a * requests + b), c = 1/%.0f\n",
                CSCS_COST_C_DIVISOR);
    else
        fprintf(f, "%% RT[ms] = c * tuples / cores * (a * requests + b) + d * requests, c = 1/%.0f\n"
                   "%% (the paper's model plus a cost per request that does not grow with the\n"
                   "%% partition: materialising and merging the rows a request matches)\n",
                CSCS_COST_C_DIVISOR);
    fprintf(f, "%% Fit error (relative): rms %.1f %%, max %.1f %%, on %s.\n", 100 * fit->rms_rel_err,
            100 * fit->max_rel_err, wall ? "wall-clock response times"
                                         : "response times on cores of its own (scan CPU time)");
    if (fit->held[0])
        fprintf(f, "%% Held at 0 to stay non-negative: %s.\n", fit->held);
    fprintf(f, "db_cost_constants(%s, %s, %.0f).\n", a, b, CSCS_COST_C_DIVISOR);
    if (fit->model == MODEL_PAPER) {
        fprintf(f,
                "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
                "    Cores is (NTuples * (%s * NRequests + %s)) / (%.0f * RTimeMs).\n",
                a, b, CSCS_COST_C_DIVISOR);
    } else {
        fprintf(f,
                "db_cost_per_request(%s).\n"
                "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
                "    Budget is RTimeMs - %s * NRequests,\n"
                "    (   Budget > 0\n"
                "    ->  Cores is (NTuples * (%s * NRequests + %s)) / (%.0f * Budget)\n"
                "    ;   Cores = 1.0e9      %% the per-request cost alone exceeds the SLA\n"
                "    ).\n",
                d, d, a, b, CSCS_COST_C_DIVISOR);
    }
    return ferror(f) ? -1 : 0;
}

/* Every --cores value must be one this process may run on; 0, or 2 after the message. */
static int check_core_counts(const struct calibrate_options *o, size_t nallowed)
{
    for (size_t i = 0; i < o->ncores; i++)
        if (o->cores[i] == 0 || o->cores[i] > nallowed) {
            fprintf(stderr, "cscs calibrate: --cores %zu: this process may use 1 to %zu cores\n",
                    o->cores[i], nallowed);
            return 2;
        }
    return 0;
}

/* The header lines of the CSV (when asked for) and of the table of measured points. */
static void print_measure_header(const struct calibrate_options *o, FILE *csv)
{
    if (csv)
        fprintf(csv, "cores,tuples_per_core,requests,rt_ms,wall_ms\n");
    printf("# cscs calibrate: median of %u batches per point after one warm-up; "
           "requests are 4 queries : 1 update; fitting %s\n", o->batches,
           o->wall ? "wall-clock response time"
                   : "response time on cores of its own (scan threads' CPU time)");
    printf("%6s %15s %9s %12s %12s\n", "cores", "tuples_per_core", "requests", "rt_ms", "wall_ms");
    fflush(stdout);
}

/* One engine per (tuples per core, cores), measured at every request count; each point
 * printed (and written to the CSV) as soon as it is measured.  *npts counts the points
 * measured, also when one fails (-1, err set). */
static int measure_all_points(const struct calibrate_options *o, int *allowed, FILE *csv, uint64_t *rng,
                              struct calib_point *pts, size_t *npts, char *err, size_t errlen)
{
    for (size_t ti = 0; ti < o->ntpc; ti++)
        for (size_t ki = 0; ki < o->ncores; ki++) {
            size_t k = o->cores[ki], t = o->tuples_per_core[ti];
            struct engine_config ec = { .seed = o->seed, .ntuples = k * t, .cpus = allowed, .ncpus = k };
            struct engine *e;
            if (engine_create(&ec, &e, err, errlen) != 0)
                return -1;
            for (size_t ri = 0; ri < o->nrequests; ri++) {
                struct calib_point *p = &pts[*npts];
                *p = (struct calib_point){ k, t, o->requests[ri], 0, 0 };
                if (measure(e, p->requests, o->batches, o->wall, rng, p, err, errlen) != 0) {
                    engine_destroy(e);
                    return -1;
                }
                (*npts)++;
                printf("%6zu %15zu %9zu %12.3f %12.3f\n", k, t, p->requests, p->rt_ms, p->wall_ms);
                fflush(stdout);
                if (csv)
                    fprintf(csv, "%zu,%zu,%zu,%.4f,%.4f\n", k, t, p->requests, p->rt_ms, p->wall_ms);
            }
            engine_destroy(e);
        }
    return 0;
}

/* Both models fitted (fits[MODEL_PAPER], fits[MODEL_EXTENDED]), for the comparison. */
static int fit_both_models(const struct calib_point *pts, size_t npts, struct calib_fit fits[2], char *err,
                           size_t errlen)
{
    for (int m = MODEL_PAPER; m <= MODEL_EXTENDED; m++)
        if (calib_fit(pts, npts, (enum cost_model)m, &fits[m]) != 0) {
            snprintf(err, errlen, "cannot fit the model: give at least three points with "
                                  "different tuples per core and requests");
            return -1;
        }
    return 0;
}

/* Each model's constants and errors, then every point with both models' predictions. */
static void print_fits(const struct calibrate_options *o, const struct calib_fit fits[2],
                       const struct calib_point *pts, size_t npts)
{
    for (int m = MODEL_PAPER; m <= MODEL_EXTENDED; m++)
        printf("# fit, %s model: a = %.6g, b = %.6g%s%.6g; relative error rms %.1f %%, max %.1f %%%s%s%s\n",
               m == MODEL_PAPER ? "the paper's" : "extended", fits[m].a, fits[m].b,
               m == MODEL_PAPER ? "" : ", d = ", m == MODEL_PAPER ? 0.0 : fits[m].d,
               100 * fits[m].rms_rel_err, 100 * fits[m].max_rel_err, fits[m].held[0] ? "; held at 0: " : "",
               fits[m].held, m == (int)o->model ? "  <- written" : "");
    printf("%6s %15s %9s %12s %12s %8s %12s %8s\n", "cores", "tuples_per_core", "requests", "rt_ms",
           "paper_ms", "error", "extended_ms", "error");
    for (size_t i = 0; i < npts; i++) {
        size_t t = pts[i].tuples_per_core * pts[i].cores;
        double p0 = calib_predict(&fits[0], t, pts[i].cores, pts[i].requests);
        double p1 = calib_predict(&fits[1], t, pts[i].cores, pts[i].requests);
        printf("%6zu %15zu %9zu %12.3f %12.3f %7.1f%% %12.3f %7.1f%%\n", pts[i].cores,
               pts[i].tuples_per_core, pts[i].requests, pts[i].rt_ms, p0,
               100 * (p0 - pts[i].rt_ms) / pts[i].rt_ms, p1, 100 * (p1 - pts[i].rt_ms) / pts[i].rt_ms);
    }
}

/* The chosen model's cost function to --out (stdout without it). */
static int write_cost_fn_out(const struct calibrate_options *o, const struct calib_fit *fit,
                             const struct calib_point *pts, size_t npts, char *err, size_t errlen)
{
    FILE *f = o->out_path ? fopen(o->out_path, "w") : stdout;
    if (!f) {
        snprintf(err, errlen, "--out %s: %s", o->out_path, strerror(errno));
        return -1;
    }
    int wrc = write_cost_fn(f, fit, pts, npts, o->wall);
    if (o->out_path && fclose(f) != 0)
        wrc = -1;
    if (wrc != 0) {
        snprintf(err, errlen, "writing the cost function failed");
        return -1;
    }
    return 0;
}

/* The last line: the written model's constants and both models' errors, as JSON. */
static void print_result_json(const struct calibrate_options *o, const struct calib_fit fits[2], size_t npts)
{
    const struct calib_fit *fit = &fits[o->model];
    char a[64], b[64], d[64];
    prolog_float(fit->a, a, sizeof a);
    prolog_float(fit->b, b, sizeof b);
    prolog_float(fit->d, d, sizeof d);
    printf("{\"model\": \"%s\", \"a\": %s, \"b\": %s, \"d\": %s, \"c_divisor\": %.0f, \"points\": %zu, "
           "\"rms_rel_err\": %.4f, \"max_rel_err\": %.4f, \"paper_model_rms_rel_err\": %.4f, "
           "\"extended_model_rms_rel_err\": %.4f}\n",
           o->model == MODEL_PAPER ? "paper" : "extended", a, b, d, CSCS_COST_C_DIVISOR, npts,
           fit->rms_rel_err, fit->max_rel_err, fits[0].rms_rel_err, fits[1].rms_rel_err);
}

int cscs_calibrate(const struct calibrate_options *o)
{
    char err[512] = "";
    int *allowed = NULL, status = 1;
    size_t nallowed = 0, npts = 0;
    struct calib_point *pts = calloc(o->ncores * o->ntpc * o->nrequests + 1, sizeof *pts);
    FILE *csv = NULL;
    uint64_t rng = cscs_seed_hash(o->seed ^ 0xCA11ULL);
    struct calib_fit fits[2];
    if (!pts || cpulist_allowed(&allowed, &nallowed) != 0) {
        fprintf(stderr, "cscs calibrate: cannot read this process's CPUs or out of memory\n");
        goto out;
    }
    if (check_core_counts(o, nallowed) != 0) {
        status = 2;
        goto out;
    }
    if (o->csv_path && !(csv = fopen(o->csv_path, "w"))) {
        fprintf(stderr, "cscs calibrate: --csv %s: %s\n", o->csv_path, strerror(errno));
        goto out;
    }
    print_measure_header(o, csv);
    if (measure_all_points(o, allowed, csv, &rng, pts, &npts, err, sizeof err) != 0 ||
        fit_both_models(pts, npts, fits, err, sizeof err) != 0)
        goto fail;
    print_fits(o, fits, pts, npts);
    if (write_cost_fn_out(o, &fits[o->model], pts, npts, err, sizeof err) != 0)
        goto fail;
    print_result_json(o, fits, npts);
    status = 0;
    goto out;
fail:
    fprintf(stderr, "cscs calibrate: %s\n", err);
out:
    if (csv)
        fclose(csv);
    free(pts);
    free(allowed);
    return status;
}
