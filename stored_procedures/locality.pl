/*  MCC-DB's locality strength of a query plan (the seed 003, Lee et al.,
    VLDB 2009), from the facts a database pushes and the SKB's cache sizes.
*/

:- module(locality,
          [ plan_locality/2,         % +Plan, -Class
            operator_locality/3,     % +Plan, +Op, -Class
            locality_cache_bytes/1,  % -Bytes
            locality_thresholds/3    % +CacheBytes, -StrongMax, -ModerateMax
          ]).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(error)).
:- use_module(library(aggregate)).
:- use_module(cod_skb(cod_sys)).

/** <module> Locality strength of query plans (MCC-DB)

A library procedure, module-transparent like cscs.pl: the calling
application's facts are read in its own namespace.  A task's `locality`
property can be derived from it:
`{"query": "plan_locality(q1, L)", "var": "L"}`.

The application pushes, per plan and operator:

  - plan_operator(Plan, Op, Kind, Level): operator Op of Plan is a
    Kind (hash_join, index_join, scan, sort, aggregate, ...) at join
    level Level (1 = the join nearest the fact table);
  - hash_table_bytes(Plan, Op, Bytes): the build side's hash table of a
    hash join;
  - working_set_bytes(Plan, Op, Bytes) and access(Plan, Op, Pattern),
    Pattern one of reuse | once: for other operators (optional).

Rules (the seed's, thresholds stated):

  1. An index join is weak: random lookups into a huge fact table, each
     touched once.  A scan is weak: a large volume read once.
  2. A hash join's class follows its hash table's size H against the
     cache size C: strong when H =< C/2, moderate when C/2 < H =< 2C,
     weak when H > 2C.  (The seed gives no numbers; these place its
     figure's tables on a 4 MB cache as 0.78 MB strong, 2.26 MB and
     4.10 MB moderate, 8.92 MB weak.)
  3. Another operator with working_set_bytes and access: `once` is weak,
     `reuse` is classed by its working set as in rule 2; without those
     facts it does not count.
  4. A plan: only its first two join levels matter (the seed: 0.96 % to
     3.8 % of the fact tuples reach the third level).  Weak when any
     operator there is weak; otherwise what its operators of those levels
     reuse together (hash tables, working sets) is classed by rule 2;
     with nothing there to class, weak (a plan that only scans).
  5. C is the smallest last-level cache of the machine (L3, or L2 where
     there is no L3): the plan may run on any cores.
*/

:- module_transparent plan_locality/2, operator_locality/3.

%   Inside the two transparent predicates, goals resolve in the caller's module:
%   this module's helpers are called qualified.

%!  locality_cache_bytes(-Bytes) is semidet.
%
%   The cache size C of rule 5; fails when the SKB knows no cache size.
locality_cache_bytes(Bytes) :-
    (   aggregate_all(min(S), (l3_domain(_, S), integer(S)), Bytes)
    ->  true
    ;   aggregate_all(min(S), (cache(2, T, S, _), T \== instruction, integer(S)), Bytes)
    ).

%!  locality_thresholds(+CacheBytes, -StrongMax, -ModerateMax) is det.
%
%   Rule 2's bounds: strong up to StrongMax bytes, moderate up to ModerateMax.
%   @error type_error(positive_integer, CacheBytes)
locality_thresholds(C, StrongMax, ModerateMax) :-
    must_be(positive_integer, C),
    StrongMax is C // 2,
    ModerateMax is 2 * C.

%!  operator_locality(+Plan, +Op, -Class) is semidet.
%
%   Class (strong, moderate or weak) of operator Op of the calling
%   application's Plan, by rules 1-3; fails for an operator rule 3 cannot
%   class.
%   @error existence_error(plan_operator, Plan-Op) when Plan has no such operator
%   @error existence_error(cache_size, machine) when the SKB knows no cache size
operator_locality(Plan, Op, Class) :-
    must_be(atomic, Plan),
    must_be(atomic, Op),
    context_module(App),
    (   App:plan_operator(Plan, Op, Kind, _)
    ->  true
    ;   existence_error(plan_operator, Plan-Op)
    ),
    locality:kind_locality(App, Plan, Op, Kind, Class).

kind_locality(_, _, _, index_join, weak) :- !.
kind_locality(_, _, _, scan, weak) :- !.
kind_locality(App, Plan, Op, hash_join, Class) :- !,
    (   App:hash_table_bytes(Plan, Op, H)
    ->  size_class(H, Class)
    ;   existence_error(hash_table_bytes, Plan-Op)
    ).
kind_locality(App, Plan, Op, _, Class) :-
    App:access(Plan, Op, Pattern),
    (   Pattern == once
    ->  Class = weak
    ;   App:working_set_bytes(Plan, Op, W),
        size_class(W, Class)
    ).

%   The bytes an operator reuses: a hash join's table, another one's working set.
op_bytes(App, Plan, Op, hash_join, B) :- !,
    App:hash_table_bytes(Plan, Op, B).
op_bytes(App, Plan, Op, _, B) :-
    App:access(Plan, Op, reuse),
    App:working_set_bytes(Plan, Op, B).

size_class(Bytes, Class) :-
    must_be(nonneg, Bytes),
    (   locality_cache_bytes(C)
    ->  true
    ;   existence_error(cache_size, machine)
    ),
    locality_thresholds(C, S, M),
    (   Bytes =< S -> Class = strong
    ;   Bytes =< M -> Class = moderate
    ;   Class = weak
    ).

%!  plan_locality(+Plan, -Class) is det.
%
%   Class of the calling application's Plan by rule 4.
%   @error existence_error(plan, Plan) when the application pushed no operator of Plan
plan_locality(Plan, Class) :-
    must_be(atomic, Plan),
    context_module(App),
    findall(Op-Kind, (App:plan_operator(Plan, Op, Kind, Level), Level =< 2), Ops),
    (   Ops == [], \+ App:plan_operator(Plan, _, _, _)
    ->  existence_error(plan, Plan)
    ;   true
    ),
    findall(C, (member(Op-Kind, Ops), locality:kind_locality(App, Plan, Op, Kind, C)), Classes),
    (   memberchk(weak, Classes)
    ->  Class = weak
    ;   Classes \== []
    ->  aggregate_all(sum(B), (member(Op-Kind, Ops), locality:op_bytes(App, Plan, Op, Kind, B)), Total),
        locality:size_class(Total, Class)
    ;   Class = weak  % nothing in the first two levels reuses data: a scan-only plan
    ).
