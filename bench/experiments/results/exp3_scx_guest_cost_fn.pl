% CSCS cost function (COD paper, Section 4.4), fitted by `cscs calibrate`
% on virtme-ng at 2026-11-27T09:55:31Z from 9 points: 1..3 cores, 150000..150000 tuples per core,
% 1280..5120 requests per batch.
% RT[ms] = c * tuples / cores * (a * requests + b), c = 1/3750000
% Fit error (relative): rms 27.5 %, max 53.1 %, on wall-clock response times.
db_cost_constants(0.281594921572, 1605.1577425, 3750000).
db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-
    Cores is (NTuples * (0.281594921572 * NRequests + 1605.1577425)) / (3750000 * RTimeMs).
