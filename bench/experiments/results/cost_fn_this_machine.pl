% CSCS cost function (COD paper, Section 4.4), fitted by `cscs calibrate`
% on vm at 2026-11-23T18:23:04Z from 18 points: 1..2 cores, 1000000..16000000 tuples per core,
% 640..5120 requests per batch.
% RT[ms] = c * tuples / cores * (a * requests + b), c = 1/3750000
% Fit error (relative): rms 28.3 %, max 66.8 %, on response times on cores of its own (scan CPU time).
db_cost_constants(0.00455680499536, 33.6645349982, 3750000).
db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-
    Cores is (NTuples * (0.00455680499536 * NRequests + 33.6645349982)) / (3750000 * RTimeMs).
