/* `cscs calibrate`: measure batch response time over cores, tuples per
 * core and requests per batch, and fit the COD paper's Section 4.4 model
 *     RT[ms] = c * tuples / cores * (a * requests + b)
 * by least squares on the relative error, with c = 1/3,750,000 kept as the
 * paper's normalisation.  The result is the cost function CSCS pushes to
 * the SKB (db_cost_fn/4, read by dbos_cost_function/3 of Listing 3). */
#ifndef CSCS_CALIBRATE_H
#define CSCS_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#define CSCS_COST_C_DIVISOR 3750000.0

struct calib_point {
    size_t cores, tuples_per_core, requests;
    double rt_ms;   /* median over the measured batches, of what is fitted */
    double wall_ms; /* median wall time, for the record */
};

/* MODEL_PAPER: Section 4.4 as it stands.  MODEL_EXTENDED adds d * requests,
 * a cost per request that does not grow with the partition: materialising
 * the few rows a point query matches (all 48 columns of each) and merging
 * them, which the paper's model, fitted on a workload where that cost was
 * hidden, has no term for. */
enum cost_model { MODEL_PAPER, MODEL_EXTENDED };

struct calib_fit {
    enum cost_model model;
    double a, b, d; /* d is 0 in MODEL_PAPER */
    double rms_rel_err, max_rel_err;
    char held[16];  /* constants held at 0 to keep them non-negative, e.g. "a" */
};

/* Least squares of the relative error over the points, every constant
 * non-negative (pure: no I/O).  Returns -1 if the points cannot fix the
 * model (fewer points than constants, or no positive response time). */
int calib_fit(const struct calib_point *pts, size_t n, enum cost_model model, struct calib_fit *fit);
double calib_predict(const struct calib_fit *fit, size_t tuples, size_t cores, size_t requests);
/* A number in Prolog float syntax (always with a '.'). */
void prolog_float(double x, char *buf, size_t len);

struct calibrate_options {
    const size_t *cores; /* core counts */
    size_t ncores;
    const size_t *tuples_per_core;
    size_t ntpc;
    const size_t *requests; /* per batch, 4 queries : 1 update */
    size_t nrequests;
    unsigned batches;       /* measured per point, after one warm-up batch */
    uint64_t seed;
    const char *out_path;   /* Prolog cost function; NULL: stdout */
    const char *csv_path;
    enum cost_model model;  /* the one written to out_path */
    int wall;               /* measure wall time, not the scan threads' CPU time */
};

int cscs_calibrate(const struct calibrate_options *o);

#endif
