#define _GNU_SOURCE
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
           (fit->a * (double)requests + fit->b);
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

int calib_fit(const struct calib_point *pts, size_t n, struct calib_fit *fit)
{
    /* RT = a * x1 + b * x2 with x1 = c*T/k*R, x2 = c*T/k; dividing each row
     * by the measured RT weighs every point by its relative error. */
    double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
    memset(fit, 0, sizeof *fit);
    if (n < 2)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!(pts[i].rt_ms > 0))
            return -1;
        double x2 = (double)pts[i].tuples_per_core / CSCS_COST_C_DIVISOR;
        double u1 = x2 * (double)pts[i].requests / pts[i].rt_ms, u2 = x2 / pts[i].rt_ms;
        s11 += u1 * u1;
        s12 += u1 * u2;
        s22 += u2 * u2;
        r1 += u1;
        r2 += u2;
    }
    double det = s11 * s22 - s12 * s12;
    if (fabs(det) > 1e-12 * s11 * s22) {
        fit->a = (r1 * s22 - r2 * s12) / det;
        fit->b = (s11 * r2 - s12 * r1) / det;
    } else {
        fit->a = -1; /* requests do not vary: fit b alone below */
    }
    if (fit->a < 0) {
        fit->a = 0;
        fit->b = r2 / s22;
        fit->note = "a held at 0 (the response time does not grow with the requests here)";
    } else if (fit->b < 0) {
        fit->b = 0;
        fit->a = r1 / s11;
        fit->note = "b held at 0 (a scan costs nothing beyond its requests here)";
    }
    fit_errors(pts, n, fit);
    return 0;
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

/* Median response time (index + slowest scan + merge) of `batches` batches
 * of `requests` after one warm-up. */
static int measure(struct engine *e, size_t requests, unsigned batches, uint64_t *rng,
                   double *median, char *err, size_t errlen)
{
    struct batch b;
    struct batch_output out = { 0 };
    double *rt = calloc(batches, sizeof *rt);
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
        if (i > 0)
            rt[i - 1] = st.index_ms + st.scan_max_ms + st.merge_ms;
    }
    qsort(rt, batches, sizeof *rt, cmp_double);
    *median = batches % 2 ? rt[batches / 2] : (rt[batches / 2 - 1] + rt[batches / 2]) / 2;
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
                         size_t n)
{
    char host[128] = "this machine", when[64] = "", a[64], b[64];
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
    fprintf(f,
            "%% CSCS cost function (COD paper, Section 4.4), fitted by `cscs calibrate`\n"
            "%% on %s at %s from %zu points: 1..%zu cores, %zu..%zu tuples per core,\n"
            "%% %zu..%zu requests per batch.  RT[ms] = c * tuples / cores * (a * requests + b),\n"
            "%% c = 1/%.0f; fit error (relative): rms %.1f %%, max %.1f %%.\n",
            host, when, n, kmax, tmin, tmax, rmin, rmax, CSCS_COST_C_DIVISOR,
            100 * fit->rms_rel_err, 100 * fit->max_rel_err);
    if (fit->note)
        fprintf(f, "%% Note: %s.\n", fit->note);
    fprintf(f,
            "db_cost_constants(%s, %s, %.0f).\n"
            "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
            "    Cores is (NTuples * (%s * NRequests + %s)) / (%.0f * RTimeMs).\n",
            a, b, CSCS_COST_C_DIVISOR, a, b, CSCS_COST_C_DIVISOR);
    return ferror(f) ? -1 : 0;
}

int cscs_calibrate(const struct calibrate_options *o)
{
    char err[512] = "";
    int *allowed = NULL, status = 1;
    size_t nallowed = 0, npts = 0;
    struct calib_point *pts = calloc(o->ncores * o->ntpc * o->nrequests + 1, sizeof *pts);
    FILE *csv = NULL;
    uint64_t rng = cscs_seed_hash(o->seed ^ 0xCA11ULL);
    if (!pts || cpulist_allowed(&allowed, &nallowed) != 0) {
        fprintf(stderr, "cscs calibrate: cannot read this process's CPUs or out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < o->ncores; i++)
        if (o->cores[i] == 0 || o->cores[i] > nallowed) {
            fprintf(stderr, "cscs calibrate: --cores %zu: this process may use 1 to %zu cores\n",
                    o->cores[i], nallowed);
            status = 2;
            goto out;
        }
    if (o->csv_path && !(csv = fopen(o->csv_path, "w"))) {
        fprintf(stderr, "cscs calibrate: --csv %s: %s\n", o->csv_path, strerror(errno));
        goto out;
    }
    if (csv)
        fprintf(csv, "cores,tuples_per_core,requests,rt_ms\n");
    printf("# cscs calibrate: median of %u batches per point after one warm-up; "
           "requests are 4 queries : 1 update\n", o->batches);
    printf("%6s %15s %9s %12s\n", "cores", "tuples_per_core", "requests", "rt_ms");
    fflush(stdout);
    for (size_t ti = 0; ti < o->ntpc; ti++)
        for (size_t ki = 0; ki < o->ncores; ki++) {
            size_t k = o->cores[ki], t = o->tuples_per_core[ti];
            struct engine_config ec = { .seed = o->seed, .ntuples = k * t, .cpus = allowed, .ncpus = k };
            struct engine *e;
            if (engine_create(&ec, &e, err, sizeof err) != 0)
                goto fail;
            for (size_t ri = 0; ri < o->nrequests; ri++) {
                struct calib_point *p = &pts[npts];
                *p = (struct calib_point){ k, t, o->requests[ri], 0 };
                if (measure(e, p->requests, o->batches, &rng, &p->rt_ms, err, sizeof err) != 0) {
                    engine_destroy(e);
                    goto fail;
                }
                npts++;
                printf("%6zu %15zu %9zu %12.3f\n", k, t, p->requests, p->rt_ms);
                fflush(stdout);
                if (csv)
                    fprintf(csv, "%zu,%zu,%zu,%.4f\n", k, t, p->requests, p->rt_ms);
            }
            engine_destroy(e);
        }
    struct calib_fit fit;
    if (calib_fit(pts, npts, &fit) != 0) {
        snprintf(err, sizeof err, "cannot fit the model: give at least two points with different "
                                  "tuples per core or requests");
        goto fail;
    }
    printf("# fit: a = %.6g, b = %.6g, c = 1/%.0f; relative error rms %.1f %%, max %.1f %%%s%s\n",
           fit.a, fit.b, CSCS_COST_C_DIVISOR, 100 * fit.rms_rel_err, 100 * fit.max_rel_err,
           fit.note ? "; " : "", fit.note ? fit.note : "");
    printf("%6s %15s %9s %12s %12s %8s\n", "cores", "tuples_per_core", "requests", "rt_ms",
           "model_ms", "error");
    for (size_t i = 0; i < npts; i++) {
        double pred = calib_predict(&fit, pts[i].tuples_per_core * pts[i].cores, pts[i].cores,
                                    pts[i].requests);
        printf("%6zu %15zu %9zu %12.3f %12.3f %7.1f%%\n", pts[i].cores, pts[i].tuples_per_core,
               pts[i].requests, pts[i].rt_ms, pred, 100 * (pred - pts[i].rt_ms) / pts[i].rt_ms);
    }
    FILE *f = o->out_path ? fopen(o->out_path, "w") : stdout;
    if (!f) {
        snprintf(err, sizeof err, "--out %s: %s", o->out_path, strerror(errno));
        goto fail;
    }
    int wrc = write_cost_fn(f, &fit, pts, npts);
    if (o->out_path && fclose(f) != 0)
        wrc = -1;
    if (wrc != 0) {
        snprintf(err, sizeof err, "writing the cost function failed");
        goto fail;
    }
    char a[64], b[64];
    prolog_float(fit.a, a, sizeof a);
    prolog_float(fit.b, b, sizeof b);
    printf("{\"a\": %s, \"b\": %s, \"c_divisor\": %.0f, \"points\": %zu, \"rms_rel_err\": %.4f, "
           "\"max_rel_err\": %.4f}\n",
           a, b, CSCS_COST_C_DIVISOR, npts, fit.rms_rel_err, fit.max_rel_err);
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
