/*  plunit tests of stored_procedures/cscs.pl on the reference machines.

    Run by tests/stored_procedures/test_stored_procedures_plunit.py, which writes each
    machine's facts (cod.facts' Prolog export) into the directory named by
    COD_TEST_MACHINES and runs:
        swipl -g run_tests -t halt stored_procedures/cscs.plt
*/

:- prolog_load_context(directory, Dir),
   atom_concat(Dir, '/../skb/prolog', SkbDir),
   asserta(user:file_search_path(cod_skb, SkbDir)).
:- use_module(cod_skb(cod_sys)).
:- use_module(cscs).
:- use_module(library(plunit)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(pairs)).
:- use_module(library(readutil)).

%   use_machine(+Name): the SKB's system facts become those of Name.
use_machine(Name) :-
    forall(cod_sys_predicate(P, A), ( functor(H, P, A), retractall(cod_sys:H) )),
    (   getenv('COD_TEST_MACHINES', Dir)
    ->  true
    ;   throw(error(existence_error(environment_variable, 'COD_TEST_MACHINES'), _))
    ),
    format(atom(File), '~w/~w.pl', [Dir, Name]),
    read_file_to_terms(File, Terms, []),
    maplist(cod_sys_assert, Terms).

%   An application namespace as the SKB makes one: its facts, and the
%   library procedures through the default import of user.
app_facts(Facts) :-
    retractall(app_test:db_tsize(_)),
    retractall(app_test:db_ntuple(_)),
    retractall(app_test:db_nquery(_)),
    retractall(app_test:db_nupdate(_)),
    retractall(app_test:db_rtime(_)),
    forall(member(F, Facts), assertz(app_test:F)).

:- dynamic app_test:db_tsize/1, app_test:db_ntuple/1, app_test:db_nquery/1,
   app_test:db_nupdate/1, app_test:db_rtime/1.

app_test:db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-
    Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs).

redistribute(Current, Cores, Status, Parts, Moves) :-
    app_test:cscs_redistribute(Current, Cores, Status, Parts, Moves).

%   The plan is consistent: parts for exactly Cores, in order; applying the
%   moves to Current gives Parts; a core gives or takes, never both.
consistent(Current, Cores, Parts, Moves) :-
    pairs_keys(Parts, Cores),
    pairs_values(Current, Cs), sum_list(Cs, Total),
    pairs_values(Parts, Ps), sum_list(Ps, Total),
    forall(member(move(F, T, N), Moves), ( N > 0, F \== T )),
    pairs_keys(Current, Old),
    union(Old, Cores, All),
    forall(member(C, All),
           ( ( memberchk(C-H, Current) -> true ; H = 0 ),
             ( memberchk(C-W, Parts) -> true ; W = 0 ),
             aggregate_all(sum(N), member(move(C, _, N), Moves), Out),
             aggregate_all(sum(N), member(move(_, C, N), Moves), In),
             \+ ( Out > 0, In > 0 ),
             W =:= H - Out + In )).

spread(Parts, Spread) :-
    pairs_values(Parts, Ts),
    max_list(Ts, Max), min_list(Ts, Min),
    Spread is Max - Min.

numlist_from(Lo, Hi, L) :- numlist(Lo, Hi, L).

:- begin_tests(cscs_redistribute).

% Section 7.4's run: 180 * 10^6 tuples on all 48 MagnyCours cores; a
% stressor arrives and CSCS loses core 0.
test(magnycours_loses_one_core) :-
    use_machine(magnycours), app_facts([db_tsize(315)]),
    numlist_from(0, 47, All),
    findall(C-3750000, member(C, All), Current),
    numlist_from(1, 47, Left),
    redistribute(Current, Left, Status, Parts, Moves),
    assertion(Status == 0),
    assertion(consistent(Current, Left, Parts, Moves)),
    spread(Parts, Spread), assertion(Spread =< 1),
    % everything moved comes from core 0, to all 47 others
    assertion(forall(member(move(F, _, _), Moves), F == 0)),
    length(Moves, 47).

test(gaining_cores_takes_from_the_closest) :-
    use_machine(magnycours), app_facts([db_tsize(315)]),
    % two partitions on nodes 0 and 1; gain a core on each of those nodes
    redistribute([0-1000, 6-1000], [0, 6, 1, 7], 0, Parts, Moves),
    assertion(Parts == [0-500, 6-500, 1-500, 7-500]),
    assertion(Moves == [move(0, 1, 500), move(6, 7, 500)]).

test(lost_cores_give_to_their_own_l3_first) :-
    use_machine(zen2x7451), app_facts([db_tsize(315)]),
    % CCX 0 is CPUs 0-2 (+48-50), CCX 1 is 3-5 (+51-53), one NUMA node
    redistribute([0-600, 1-600, 3-600, 4-600], [4, 1], 0, Parts, Moves),
    assertion(Parts == [4-1200, 1-1200]),
    assertion(Moves == [move(0, 1, 600), move(3, 4, 600)]).

test(smt_sibling_before_l3_neighbour) :-
    use_machine(zen2x7451), app_facts([db_tsize(315)]),
    redistribute([0-900, 1-900, 48-900], [1, 48], 0, _, Moves),
    assertion(Moves == [move(0, 48, 450), move(0, 1, 450)]).

test(odd_tuples_go_to_the_cores_that_hold_most) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-5, 1-2], [0, 1, 2], 0, Parts, Moves),
    assertion(Parts == [0-3, 1-2, 2-2]),
    assertion(Moves == [move(0, 2, 2)]).

% Shanghai: 4 GiB per node, 13,634,719 tuples of 315 B.  Node 0 cannot
% take 20 M tuples evenly: core 1 takes its half of the free memory and
% core 0 the rest.
test(a_short_node_takes_what_fits) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-10000000, 4-10000000], [0, 1], Status, Parts, Moves),
    assertion(Status == 0),
    Half is (4294967296 // 315) // 2,
    Rest is 20000000 - Half,
    assertion(Parts == [0-Rest, 1-Half]),
    assertion(consistent([0-10000000, 4-10000000], [0, 1], Parts, Moves)).

test(short_nodes_spill_to_other_nodes) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    cod_sys_retract(numa_free(0, _), _),
    cod_sys_assert(numa_free(0, 315000)),          % room for 1000 tuples
    redistribute([4-9000], [0, 4, 8], 0, Parts, _),
    assertion(Parts == [0-1000, 4-4000, 8-4000]).

test(no_room_anywhere_gives_status_2) :-
    use_machine(barcelona), app_facts([db_tsize(315)]),
    % 2 GiB per node: 30 M tuples (9.45 GB) cannot live on one node's cores
    redistribute([0-15000000, 4-15000000], [0, 1], Status, Parts, Moves),
    assertion(Status-Parts-Moves == 2-[]-[]).

test(unknown_free_memory_is_not_checked) :-
    use_machine(zen2x7451), app_facts([db_tsize(315)]),
    redistribute([0-1000000000000], [1], 0, [1-1000000000000], _).

test(same_cores_moves_nothing) :-
    use_machine(nehalem_ex), app_facts([db_tsize(315)]),
    redistribute([0-10, 8-10], [0, 8], 0, [0-10, 8-10], []).

test(random_plans_are_consistent_and_balanced) :-
    use_machine(magnycours), app_facts([db_tsize(315)]),
    set_random(seed(42)),
    forall(between(1, 200, _),
           ( random_between(1, 48, NOld), random_between(1, 48, NNew),
             numlist(0, 47, All),
             random_permutation(All, P1), length(Old, NOld), append(Old, _, P1),
             random_permutation(All, P2), length(New, NNew), append(New, _, P2),
             findall(C-T, ( member(C, Old), random_between(0, 100000, T) ), Current),
             redistribute(Current, New, 0, Parts, Moves),
             consistent(Current, New, Parts, Moves),
             spread(Parts, S), S =< 1 )).

test(empty_cores, error(domain_error(non_empty_list, []))) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-1], [], _, _, _).
test(cpu_listed_twice, error(domain_error(distinct_cpus, _))) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-1], [1, 1], _, _, _).
test(partition_listed_twice, error(domain_error(distinct_cpus, _))) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-1, 0-2], [1], _, _, _).
test(unknown_cpu, error(existence_error(cpu, 99))) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-1], [99], _, _, _).
test(not_a_pair, error(type_error(pair, 0))) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0], [1], _, _, _).
test(negative_tuples, error(type_error(nonneg, -1))) :-
    use_machine(shanghai), app_facts([db_tsize(315)]),
    redistribute([0-(-1)], [1], _, _, _).
test(no_tuple_size, error(existence_error(procedure, db_tsize/1))) :-
    use_machine(shanghai), app_facts([]),
    redistribute([0-1], [1], _, _, _).

:- end_tests(cscs_redistribute).

% Listing 3 on the reference machines: the core counts of Table 3.
:- begin_tests(dbos_cost_function).

table3(nehalem_ex, [8, 4, 2]).
table3(barcelona, [8, 5, 5]).
table3(shanghai, [8, 4, 3]).
table3(magnycours, [8, 4, 2]).

test(table3, [forall(table3(Machine, Expected))]) :-
    use_machine(Machine),
    findall(N,
            ( member(Sla, [2000, 4000, 8000]),
              app_facts([db_ntuple(30000000), db_tsize(315), db_nquery(2048),
                         db_nupdate(0), db_rtime(Sla)]),
              app_test:dbos_cost_function(0, N, _) ),
            Ns),
    assertion(Ns == Expected).

:- end_tests(dbos_cost_function).
