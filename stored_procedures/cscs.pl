/*  CSCS initial deployment: the stored procedure of the COD paper's Listing 3.
*/

:- module(cscs,
          [ dbos_cost_function/3     % -Status, -NrCores, -PartSize
          ]).
:- use_module(library(lists)).
:- use_module(cod_skb(cod_sys)).

/** <module> CSCS deployment procedure (COD paper, Listing 3)

A library procedure: preloaded by the SKB and callable by every
application.  It is module-transparent: context_module/1 names the
namespace of the application that calls it, and the application's facts
(db_ntuple/1 and the others) are read there.  System predicates come from
cod_sys, which every application sees too.

The calling application pushes, as in the paper's Listing 1:

  - db_ntuple(N): tuples in the dataset;
  - db_tsize(B): bytes per tuple;
  - db_nquery(Q), db_nupdate(U): queries and updates per batch;
  - db_rtime(Ms): the response-time SLA in milliseconds;
  - db_cost_fn(NTuples, NRequests, RTimeMs, Cores): its cost function,
    the number of cores (a real number) that meets the SLA.  For CSCS
    (Section 4.4): RT = c * tuples / cores * (a * requests + b), so
    Cores is c * NTuples * (a * NRequests + b) / RTimeMs.
*/

:- module_transparent dbos_cost_function/3.

%!  dbos_cost_function(-Status, -NrCores, -PartSize) is semidet.
%
%   Derive the deployment of the calling application's scan threads.
%
%   NrCores is the larger of (1) the cores the cost function asks for to
%   meet the SLA, rounded up, and (2) the cores needed so that every
%   partition fits in the smallest NUMA node, rounded up.  PartSize is the
%   dataset size in bytes divided by NrCores (integer division).  Status
%   is 0 when the deployment fits, 1 when there are not enough free cores,
%   2 when the dataset does not fit in free memory.
dbos_cost_function(Status, NrCores, PartSize) :-
    context_module(App),
    App:db_tsize(TSize), App:db_ntuple(NTuple),
    App:db_nquery(NQuery), App:db_nupdate(NUpdate),
    App:db_rtime(RTime),

    get_free_memory(AvailMemory),
    get_list_free_cpus(AvailCores),
    get_list_numa_sizes(NumaSizes),

    Memory is NTuple * TSize,

    NRequests is NQuery + NUpdate,
    App:db_cost_fn(NTuple, NRequests, RTime, SlaCores),
    SlaNrCores is max(1, ceiling(SlaCores)),

    min_list(NumaSizes, MinNumaSize),
    NumaNrCores is max(1, ceiling(Memory / MinNumaSize)),
    NrCores is max(NumaNrCores, SlaNrCores),

    PartSize is Memory // NrCores,

    length(AvailCores, NrAvail),
    (   NrCores > NrAvail -> Status = 1
    ;   Memory > AvailMemory -> Status = 2
    ;   Status = 0
    ).
