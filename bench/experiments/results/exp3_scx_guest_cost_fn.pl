% CSCS cost function (COD paper, Section 4.4), fitted by `cscs calibrate`
% on virtme-ng at 2026-11-27T09:41:34Z from 9 points: 1..3 cores, 150000..150000 tuples per core,
% 1280..5120 requests per batch.
% RT[ms] = c * tuples / cores * (a * requests + b), c = 1/3750000
% Fit error (relative): rms 22.8 %, max 50.4 %, on wall-clock response times.
db_cost_constants(0.941493302102, 196.420047008, 3750000).
db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-
    Cores is (NTuples * (0.941493302102 * NRequests + 196.420047008)) / (3750000 * RTimeMs).
