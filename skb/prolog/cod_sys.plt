/*  plunit tests of the system-level predicates (cod_sys.pl) on a small machine.
*/
:- begin_tests(cod_sys, [setup(machine), cleanup(forget)]).

:- use_module(cod_sys).

machine :-
    forget,
    maplist(cod_sys_assert,
            [ pu(0, 0, 0, 0), pu(1, 0, 0, 0), pu(2, 2, 0, 1), pu(3, 2, 0, 1),
              core(0, 0, 0, [0, 1]), core(2, 0, 1, [2, 3]),
              numa_node(0, 1000, [0, 1]), numa_node(1, 2000, [2, 3]), numa_free(1, 1500),
              cache(3, unified, 4096, [0, 1]), cache(3, unified, 4096, [2, 3]),
              task(db, 42, app1), allocated(db, 2), other_task(7, hog, [3]) ]).

forget :-
    forall(cod_sys_predicate(N, A), ( functor(H, N, A), retractall(cod_sys:H) )).

test(nr_cores) :- get_nr_cores(4).
test(numa_sizes) :- get_list_numa_sizes([1000, 2000]).
test(free_memory) :- get_free_memory(2500).
test(free_cpus_exclude_others_tasks_and_hogs) :- get_list_free_cpus([0, 1]).
test(smt_siblings) :- smt_siblings(3, [2, 3]).
test(l3_domains, all(C == [[0, 1], [2, 3]])) :- l3_domain(C, _).
test(memory_affinity) :- memory_affinity(1, 2000, 1500), memory_affinity(0, 1000, 1000).
test(only_schema_facts, [error(domain_error(cod_system_fact, secret/1), _)]) :- cod_sys_assert(secret(1)).

:- end_tests(cod_sys).
