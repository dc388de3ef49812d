% The CSCS cost function of the COD paper, Section 4.4, as the application
% pushes it (Listing 1): RT[ms] = c * tuples / cores * (a * requests + b),
% a = 0.85, b = 106.37, c = 1 / 3,750,000, solved for the number of cores.
db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-
    Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs).
