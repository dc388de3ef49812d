/*  plunit tests of stored_procedures/locality.pl on the reference machines.

    Run by tests/stored_procedures/test_stored_procedures_plunit.py (COD_TEST_MACHINES names
    the directory of the machines' facts):
        swipl -g run_tests -t halt stored_procedures/locality.plt
*/

:- prolog_load_context(directory, Dir),
   atom_concat(Dir, '/../skb/prolog', SkbDir),
   asserta(user:file_search_path(cod_skb, SkbDir)).
:- use_module(cod_skb(cod_sys)).
:- use_module(locality).
:- use_module(library(plunit)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(readutil)).

use_machine(Name) :-
    forall(cod_sys_predicate(P, A), ( functor(H, P, A), retractall(cod_sys:H) )),
    (   getenv('COD_TEST_MACHINES', Dir)
    ->  true
    ;   throw(error(existence_error(environment_variable, 'COD_TEST_MACHINES'), _))
    ),
    format(atom(File), '~w/~w.pl', [Dir, Name]),
    read_file_to_terms(File, Terms, []),
    maplist(cod_sys_assert, Terms).

:- dynamic app_loc:plan_operator/4, app_loc:hash_table_bytes/3,
   app_loc:working_set_bytes/3, app_loc:access/3.

app_facts(Facts) :-
    retractall(app_loc:plan_operator(_, _, _, _)),
    retractall(app_loc:hash_table_bytes(_, _, _)),
    retractall(app_loc:working_set_bytes(_, _, _)),
    retractall(app_loc:access(_, _, _)),
    forall(member(F, Facts), assertz(app_loc:F)).

plan(P, C) :- app_loc:plan_locality(P, C).
oploc(P, O, C) :- app_loc:operator_locality(P, O, C).

mib(N, B) :- B is N * 1048576.

%   The seed's figure: hash tables of 0.78, 2.26, 4.10 and 8.92 MB on its
%   4 MB shared cache, scaled to Barcelona's 2 MB L3 (halved).
seed_table(Kb, Class) :-
    member(Kb-Class, [399-strong, 1157-moderate, 2099-moderate, 4567-weak]).

:- begin_tests(locality, [setup(use_machine(barcelona))]).

test(cache_is_the_smallest_l3) :-
    locality_cache_bytes(C), C =:= 2097152.

test(thresholds) :-
    locality_thresholds(2097152, S, M), S =:= 1048576, M =:= 4194304.

test(thresholds_bad, error(type_error(positive_integer, 0))) :-
    locality_thresholds(0, _, _).

test(index_join_is_weak) :-
    app_facts([plan_operator(q1, j1, index_join, 1)]),
    oploc(q1, j1, weak), plan(q1, weak).

test(seed_hash_tables, [forall(seed_table(Kb, Class)), true(C == Class)]) :-
    B is Kb * 1024,
    app_facts([plan_operator(q, hj, hash_join, 1), hash_table_bytes(q, hj, B)]),
    oploc(q, hj, C).

test(two_levels_are_summed) :-
    mib(1, One),
    app_facts([plan_operator(q, a, hash_join, 1), hash_table_bytes(q, a, One),
               plan_operator(q, b, hash_join, 2), hash_table_bytes(q, b, One)]),
    oploc(q, a, strong), plan(q, moderate).

test(third_level_ignored) :-
    mib(1, One),
    app_facts([plan_operator(q, a, hash_join, 1), hash_table_bytes(q, a, One),
               plan_operator(q, c, index_join, 3)]),
    plan(q, strong).

test(index_join_in_second_level_makes_it_weak) :-
    app_facts([plan_operator(q, a, hash_join, 1), hash_table_bytes(q, a, 1000),
               plan_operator(q, b, index_join, 2)]),
    plan(q, weak).

test(scan_only_plan_is_weak) :-
    app_facts([plan_operator(q, s, scan, 1)]),
    plan(q, weak).

test(reuse_operator_by_working_set) :-
    app_facts([plan_operator(q, s, sort, 1), access(q, s, reuse), working_set_bytes(q, s, 4096)]),
    oploc(q, s, strong), plan(q, strong).

test(once_operator_is_weak) :-
    app_facts([plan_operator(q, s, sort, 1), access(q, s, once)]),
    oploc(q, s, weak).

test(unknown_plan, error(existence_error(plan, nope))) :-
    app_facts([]),
    plan(nope, _).

test(unknown_operator, error(existence_error(plan_operator, q-zz))) :-
    app_facts([plan_operator(q, a, scan, 1)]),
    oploc(q, zz, _).

test(hash_join_without_table, error(existence_error(hash_table_bytes, q-a))) :-
    app_facts([plan_operator(q, a, hash_join, 1)]),
    oploc(q, a, _).

test(bad_plan, error(type_error(atomic, f(x)))) :-
    plan(f(x), _).

:- end_tests(locality).

:- begin_tests(locality_bigger_cache, [setup(use_machine(nehalem_ex))]).

test(same_table_stronger_on_a_bigger_cache) :-
    mib(9, B),
    app_facts([plan_operator(q, hj, hash_join, 1), hash_table_bytes(q, hj, B)]),
    oploc(q, hj, strong).

:- end_tests(locality_bigger_cache).
