/* cscs: the Clock-Scan Column Store (COD paper, Section 4). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "control.h"
#include "cpulist.h"
#include "run.h"

static const char USAGE[] =
    "usage: cscs run --tuples N (--seconds S | --batches B) [options]\n"
    "       cscs calibrate [options]\n"
    "\n"
    "run: the engine with its closed-loop load generator; one line per batch\n"
    "  --tuples N            table size in tuples (315 B each; suffixes k, M, G)\n"
    "  --seconds S           run this long (counted from the first batch)\n"
    "  --batches B           run this many batches\n"
    "  --batch-queries Q     point queries per batch (default 2048)\n"
    "  --batch-updates U     updates per batch (default 512)\n"
    "  --sla-ms MS           response-time SLA, reported per batch\n"
    "  --think-ms MS         the load generator pauses MS between an answer and its\n"
    "                        next batch (default 0)\n"
    "  --cores LIST          scan threads on these CPUs (default: every CPU allowed)\n"
    "  --naive               one scan thread on every CPU, no reaction to anything\n"
    "  --cores-schedule SPEC change cores during the run, e.g. '#3=0;#5=0-1' or '10s=1'\n"
    "  --control FIFO        read 'cores LIST', 'plan ...' and 'stop' lines from a FIFO\n"
    "  --socket PATH         run under COD (the RM's socket; needs a libcod build)\n"
    "  --cost-fn FILE        the cost function pushed to COD (from cscs calibrate;\n"
    "                        default: the paper's constants)\n"
    "  --max-cores N         under COD: ask for at most N cores (default: every CPU\n"
    "                        this process may use)\n"
    "  --name NAME           the task's and application's name under COD (default cscs)\n"
    "  --csv FILE            one CSV row per batch\n"
    "  --results FILE        every request and every answer, as text (for tests)\n"
    "  --seed N              table and workload seed (default 1)\n"
    "  --no-numa-binding     leave partition memory to the default policy\n"
    "\n"
    "calibrate: fit RT = c * tuples/cores * (a * requests + b) on this machine\n"
    "  --cores LIST          core counts (default: 1 up to every CPU allowed)\n"
    "  --tuples-per-core LIST  (default 250k,1M,2M)\n"
    "  --requests LIST       requests per batch, 4 queries : 1 update (default 160,640,2560,5120)\n"
    "  --batches N           measured batches per point (default 7)\n"
    "  --out FILE            the fitted cost function as Prolog (default: standard output)\n"
    "  --model paper|extended  the model written: the paper's (default), or with a\n"
    "                        cost per request added (both fits are reported)\n"
    "  --wall                fit wall-clock time, not the scan threads' CPU time\n"
    "                        (the same on a quiet machine; CPU time ignores other load)\n"
    "  --csv FILE            the measured points\n"
    "  --seed N\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "cscs: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(cscs --help for usage)\n");
    return 2;
}

/* A count with an optional k/M/G suffix (powers of ten). */
static int parse_count(const char *s, size_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s)
        return -1;
    if (*end == 'k' || *end == 'K')
        v *= 1e3, end++;
    else if (*end == 'M')
        v *= 1e6, end++;
    else if (*end == 'G')
        v *= 1e9, end++;
    if (*end || v != floor(v) || v > 1e15)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_positive(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* "a,b,c" of counts. */
static int parse_counts(const char *s, size_t **out, size_t *n)
{
    char *copy = strdup(s), *save = NULL;
    size_t cap = 1;
    for (const char *c = s; *c; c++)
        cap += *c == ',';
    *out = calloc(cap, sizeof **out);
    *n = 0;
    if (!copy || !*out) {
        free(copy);
        return -1;
    }
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (parse_count(tok, &(*out)[*n]) != 0 || (*out)[*n] == 0) {
            free(copy);
            return -1;
        }
        (*n)++;
    }
    free(copy);
    return *n ? 0 : -1;
}

enum {
    OPT_TUPLES = 256, OPT_SECONDS, OPT_BATCHES, OPT_BQ, OPT_BU, OPT_SLA, OPT_CORES, OPT_NAIVE,
    OPT_SCHEDULE, OPT_CONTROL, OPT_SOCKET, OPT_COSTFN, OPT_NAME, OPT_THINK, OPT_CSV, OPT_RESULTS, OPT_SEED,
    OPT_NONUMA, OPT_MAXCORES, OPT_TPC, OPT_REQUESTS, OPT_OUT, OPT_MODEL, OPT_WALL, OPT_HELP,
};

static const struct option RUN_OPTS[] = {
    { "tuples", required_argument, 0, OPT_TUPLES },
    { "seconds", required_argument, 0, OPT_SECONDS },
    { "batches", required_argument, 0, OPT_BATCHES },
    { "batch-queries", required_argument, 0, OPT_BQ },
    { "batch-updates", required_argument, 0, OPT_BU },
    { "sla-ms", required_argument, 0, OPT_SLA },
    { "cores", required_argument, 0, OPT_CORES },
    { "naive", no_argument, 0, OPT_NAIVE },
    { "cores-schedule", required_argument, 0, OPT_SCHEDULE },
    { "control", required_argument, 0, OPT_CONTROL },
    { "socket", required_argument, 0, OPT_SOCKET },
    { "cost-fn", required_argument, 0, OPT_COSTFN },
    { "name", required_argument, 0, OPT_NAME },
    { "think-ms", required_argument, 0, OPT_THINK },
    { "csv", required_argument, 0, OPT_CSV },
    { "results", required_argument, 0, OPT_RESULTS },
    { "seed", required_argument, 0, OPT_SEED },
    { "no-numa-binding", no_argument, 0, OPT_NONUMA },
    { "max-cores", required_argument, 0, OPT_MAXCORES },
    { "help", no_argument, 0, OPT_HELP },
    { 0, 0, 0, 0 },
};

static const struct option CALIB_OPTS[] = {
    { "cores", required_argument, 0, OPT_CORES },
    { "tuples-per-core", required_argument, 0, OPT_TPC },
    { "requests", required_argument, 0, OPT_REQUESTS },
    { "batches", required_argument, 0, OPT_BATCHES },
    { "out", required_argument, 0, OPT_OUT },
    { "model", required_argument, 0, OPT_MODEL },
    { "wall", no_argument, 0, OPT_WALL },
    { "csv", required_argument, 0, OPT_CSV },
    { "seed", required_argument, 0, OPT_SEED },
    { "help", no_argument, 0, OPT_HELP },
    { 0, 0, 0, 0 },
};

/* The option handlers below return GO_ON when the command line may go on, otherwise the
 * exit status to end with (0 after --help, 2 after a usage error). */
enum { GO_ON = -1 };

/* run's options with a number: each checked for its range. */
static int take_run_number(int opt, struct run_options *o)
{
    size_t count;
    switch (opt) {
    case OPT_TUPLES:
        if (parse_count(optarg, &o->tuples) != 0 || o->tuples == 0)
            return usage_error("--tuples '%s': expected a positive count such as 3000000 or 30M", optarg);
        break;
    case OPT_SECONDS:
        if (parse_positive(optarg, &o->seconds) != 0)
            return usage_error("--seconds '%s': expected a positive number", optarg);
        break;
    case OPT_BATCHES:
        if (parse_count(optarg, &count) != 0 || count == 0)
            return usage_error("--batches '%s': expected a positive count", optarg);
        o->max_batches = count;
        break;
    case OPT_BQ:
    case OPT_BU:
        if (parse_count(optarg, &count) != 0 || count > (1u << 24))
            return usage_error("batch size '%s': expected a count from 0 to 16777216", optarg);
        *(opt == OPT_BQ ? &o->batch_queries : &o->batch_updates) = count;
        break;
    case OPT_SLA:
        if (parse_positive(optarg, &o->sla_ms) != 0)
            return usage_error("--sla-ms '%s': expected a positive number of milliseconds", optarg);
        break;
    case OPT_THINK:
        if (parse_positive(optarg, &o->think_ms) != 0 || o->think_ms > 60000)
            return usage_error("--think-ms '%s': expected a positive number of milliseconds up to 60000", optarg);
        break;
    case OPT_MAXCORES:
        if (parse_count(optarg, &count) != 0 || count == 0 || count > 4096)
            return usage_error("--max-cores '%s': expected a count from 1 to 4096", optarg);
        o->max_cores = count;
        break;
    case OPT_SEED:
        if (parse_count(optarg, &count) != 0)
            return usage_error("--seed '%s': expected a non-negative integer", optarg);
        o->seed = count;
        break;
    }
    return GO_ON;
}

/* One of run's options (from getopt_long); *cpus owns the --cores list, o->cpus points to it. */
static int take_run_option(int opt, struct run_options *o, int **cpus)
{
    char err[256];
    switch (opt) {
    case OPT_TUPLES:
    case OPT_SECONDS:
    case OPT_BATCHES:
    case OPT_BQ:
    case OPT_BU:
    case OPT_SLA:
    case OPT_THINK:
    case OPT_MAXCORES:
    case OPT_SEED:
        return take_run_number(opt, o);
    case OPT_CORES:
        free(*cpus);
        *cpus = NULL;
        if (cpulist_parse(optarg, cpus, &o->ncpus, err, sizeof err) != 0)
            return usage_error("--cores: %s", err);
        o->cpus = *cpus;
        break;
    case OPT_NAIVE: o->naive = 1; break;
    case OPT_SCHEDULE: o->schedule = optarg; break;
    case OPT_CONTROL: o->control_path = optarg; break;
    case OPT_SOCKET: o->socket_path = optarg; break;
    case OPT_COSTFN: o->cost_fn_path = optarg; break;
    case OPT_NAME:
        if (!*optarg || strlen(optarg) > 63)
            return usage_error("--name '%s': expected 1 to 63 bytes", optarg);
        o->cod_name = optarg;
        break;
    case OPT_CSV: o->csv_path = optarg; break;
    case OPT_RESULTS: o->results_path = optarg; break;
    case OPT_NONUMA: o->no_numa_binding = 1; break;
    case OPT_HELP:
        fputs(USAGE, stdout);
        return 0;
    default:
        return usage_error("%s", "unknown option for run");
    }
    return GO_ON;
}

/* The options taken together: what run needs, and the combinations it refuses. */
static int check_run_options(const struct run_options *o)
{
    char err[256];
    if (o->tuples == 0)
        return usage_error("%s", "run needs --tuples N");
    if (o->seconds == 0 && o->max_batches == 0)
        return usage_error("%s", "run needs --seconds S or --batches B");
    if (o->batch_queries + o->batch_updates == 0)
        return usage_error("%s", "a batch needs at least one query or update");
    if (o->naive && (o->cpus || o->schedule || o->control_path || o->socket_path))
        return usage_error("%s", "--naive runs on every core and reacts to nothing: "
                                 "it takes none of --cores, --cores-schedule, --control, --socket");
    if (o->socket_path && (o->cpus || o->schedule || o->control_path))
        return usage_error("%s", "under COD (--socket) the cores come from COD: "
                                 "drop --cores, --cores-schedule and --control");
    if (o->schedule) {
        /* Parsed once here, so that a bad schedule is a usage error before the run starts. */
        struct control *c;
        if (control_open(o->schedule, NULL, &c, err, sizeof err) != 0)
            return usage_error("--cores-schedule: %s", err);
        control_close(c);
    }
    if (o->cod_name && !o->socket_path)
        return usage_error("%s", "--name is the name under COD: it needs --socket");
    if (o->cost_fn_path && !o->socket_path)
        return usage_error("%s", "--cost-fn is pushed to COD: it needs --socket");
    return GO_ON;
}

static int cmd_run(int argc, char **argv)
{
    struct run_options o = { .seed = 1, .batch_queries = 2048, .batch_updates = 512 };
    int *cpus = NULL, opt, status = GO_ON;
    optind = 1;
    while (status == GO_ON && (opt = getopt_long(argc, argv, "", RUN_OPTS, NULL)) != -1)
        status = take_run_option(opt, &o, &cpus);
    if (status == GO_ON && optind < argc)
        status = usage_error("unexpected argument '%s'", argv[optind]);
    if (status == GO_ON)
        status = check_run_options(&o);
    if (status == GO_ON)
        status = cscs_run(&o);
    free(cpus);
    return status;
}

/* A list option of calibrate: *owned holds the list parsed (a repeated option replaces it),
 * *list points to it. */
static int take_count_list(const char *what, size_t **owned, const size_t **list, size_t *n)
{
    free(*owned);
    if (parse_counts(optarg, owned, n) != 0)
        return usage_error(what, optarg);
    *list = *owned;
    return GO_ON;
}

/* The lists of counts calibrate owns (given on the command line), freed at its end. */
struct calib_lists {
    size_t *cores, *tpc, *req;
};

/* One of calibrate's options (from getopt_long). */
static int take_calibrate_option(int opt, struct calibrate_options *o, struct calib_lists *l)
{
    size_t count;
    switch (opt) {
    case OPT_CORES:
        return take_count_list("--cores '%s': expected core counts such as 1,2", &l->cores, &o->cores,
                               &o->ncores);
    case OPT_TPC:
        return take_count_list("--tuples-per-core '%s': expected counts such as 250k,1M", &l->tpc,
                               &o->tuples_per_core, &o->ntpc);
    case OPT_REQUESTS:
        return take_count_list("--requests '%s': expected counts such as 640,2560", &l->req, &o->requests,
                               &o->nrequests);
    case OPT_BATCHES:
        if (parse_count(optarg, &count) != 0 || count == 0 || count > 1000)
            return usage_error("--batches '%s': expected 1 to 1000", optarg);
        o->batches = (unsigned)count;
        break;
    case OPT_OUT: o->out_path = optarg; break;
    case OPT_WALL: o->wall = 1; break;
    case OPT_MODEL:
        if (strcmp(optarg, "paper") == 0)
            o->model = MODEL_PAPER;
        else if (strcmp(optarg, "extended") == 0)
            o->model = MODEL_EXTENDED;
        else
            return usage_error("--model '%s': expected paper or extended", optarg);
        break;
    case OPT_CSV: o->csv_path = optarg; break;
    case OPT_SEED:
        if (parse_count(optarg, &count) != 0)
            return usage_error("--seed '%s': expected a non-negative integer", optarg);
        o->seed = count;
        break;
    case OPT_HELP:
        fputs(USAGE, stdout);
        return 0;
    default:
        return usage_error("%s", "unknown option for calibrate");
    }
    return GO_ON;
}

/* Without --cores: 1 up to every CPU this process may use.  -1 when they cannot be read. */
static int default_core_counts(struct calibrate_options *o, struct calib_lists *l)
{
    int *allowed = NULL;
    size_t nallowed;
    int rc = -1;
    if (cpulist_allowed(&allowed, &nallowed) != 0)
        goto out;
    l->cores = calloc(nallowed, sizeof *l->cores);
    if (!l->cores)
        goto out;
    for (size_t i = 0; i < nallowed; i++)
        l->cores[i] = i + 1;
    o->cores = l->cores;
    o->ncores = nallowed;
    rc = 0;
out:
    free(allowed);
    return rc;
}

static int cmd_calibrate(int argc, char **argv)
{
    static const size_t TPC[] = { 250000, 1000000, 2000000 };
    static const size_t REQ[] = { 160, 640, 2560, 5120 };
    struct calibrate_options o = { .tuples_per_core = TPC, .ntpc = 3, .requests = REQ,
                                   .nrequests = 4, .batches = 7, .seed = 1,
                                   .model = MODEL_PAPER };
    struct calib_lists l = { NULL, NULL, NULL };
    int opt, status = GO_ON;
    optind = 1;
    while (status == GO_ON && (opt = getopt_long(argc, argv, "", CALIB_OPTS, NULL)) != -1)
        status = take_calibrate_option(opt, &o, &l);
    if (status == GO_ON && optind < argc)
        status = usage_error("unexpected argument '%s'", argv[optind]);
    if (status == GO_ON && !o.cores && default_core_counts(&o, &l) != 0)
        status = 2;
    if (status == GO_ON)
        status = cscs_calibrate(&o);
    free(l.cores);
    free(l.tpc);
    free(l.req);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "calibrate") == 0)
        return cmd_calibrate(argc - 1, argv + 1);
    return usage_error("unknown command '%s' (expected run or calibrate)", argv[1]);
}
