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
    double rt_ms; /* median over the measured batches */
};

struct calib_fit {
    double a, b;
    double rms_rel_err, max_rel_err;
    const char *note; /* set when a constant had to be held at 0 */
};

/* Weighted least squares of the model over the points (pure: no I/O). */
int calib_fit(const struct calib_point *pts, size_t n, struct calib_fit *fit);
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
};

int cscs_calibrate(const struct calibrate_options *o);

#endif
