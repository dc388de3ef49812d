/*  Where the SKB's CPU goes in one registration and its teardown.

    swipl bench/registration_profile.pl [N] [profile]

The operations the Resource Manager sends the engine for one Listing 1
registration (bench/listing1_profile.py, read from the engine's input):
grant, one batch (the cost function, the application's facts, the task's
system facts, the allocation) and, when the client leaves, abandon,
revoke, a batch of removals, drop_owner and release_app.  Each is run N
times, for N applications, as the writer thread runs it (op_outcome/2 and
after_write/1), and its reply made and handed to the output thread
(send_outcome/2; `reply` sums those of one round).  Prints one JSON object:
CPU microseconds of this thread per operation, the mean over N.  With `profile`, also the
batch under SWI-Prolog's profiler.
*/

:- use_module('../skb/prolog/cod_guard').
:- use_module('../skb/prolog/cod_server').
:- use_module('../skb/prolog/cod_apps').
:- use_module('../skb/prolog/cod_pool').
:- use_module(library(http/json)).
:- use_module(library(statistics)).

:- initialization(registration_profile, main).

cost_fn("db_cost_fn(X, Y, Z, NrCores) :- NrCores is (X * ((0.47 * Y) + 265.29)) / (3750000 * Z).").
limits(limits(100000, 16777216, 10000, 4194304)).

registration_ops(I, [grant(Token, App, client(0, true)), Batch]) :-
    format(atom(App), 'cscs~d', [I]),
    format(atom(Token), 'token~d', [I]),
    cost_fn(Fn),
    limits(L),
    format(string(Task), "task(~w, 1389, ~w)", [App, App]),
    findall(S, ( member(P-V, [allow_smt_sharing-false, bound-cpu, exclusive-true, max_cores-2,
                              min_cores-1, pollutes_cache-false, priority-0,
                              sensitive-'[cache, numa]', working_set_bytes-0]),
                 format(string(S), "task_property(~w, ~w, ~w)", [App, P, V]) ),
            Props),
    format(string(A0), "allocated(~w, 0)", [App]),
    format(string(A1), "allocated(~w, 1)", [App]),
    Batch = batch([ add_procedure(App, Fn, false, L),
                    add_facts(App, conn(I), ["db_ntuple(3750000)", "db_tsize(315)", "db_nquery(2048)",
                                             "db_nupdate(256)", "db_rtime(3000)"], L),
                    add_system_facts([Task|Props]),
                    replace_many(["allocated(_, _)"-[A0, A1], "allocation_epoch(_)"-["allocation_epoch(21)"]])
                  ]).

teardown_ops(I, [abandon(Token), revoke(Token), Removals, drop_owner(App, conn(I)), release_app(App)]) :-
    format(atom(App), 'cscs~d', [I]),
    format(atom(Token), 'token~d', [I]),
    format(string(T), "task(~w, _, _)", [App]),
    format(string(P), "task_property(~w, _, _)", [App]),
    format(string(A), "allocated(~w, _)", [App]),
    Removals = batch([remove_system_facts(T), remove_system_facts(P), remove_system_facts(A)]).

run(Op, Outcome) :-
    cod_server:op_outcome(Op, Outcome),
    (   Outcome = ok(_) -> true ; throw(failed(Op, Outcome)) ),
    once(cod_server:after_write(Op)).

registration_profile :-
    current_prolog_flag(argv, Argv),
    ( Argv = [A|_], atom_number(A, N) -> true ; N = 300 ),
    autoload_all,
    pool_init([run(cod_server:run_op), died(cod_server:job_died)]),
    forall(cod_server:default_setting(K, V), assertz(cod_server:setting(K, V))),
    open_null_stream(Null),
    cod_server:start_output(Null),          % the replies' thread, writing nowhere
    numlist(1, N, Is),
    forall(between(1, 20, W), ( I is 100000 + W, run_round(I, _) )),     % warm up
    foldl(add_round, Is, [], Times),
    keysort(Times, Sorted),
    group_pairs_by_key(Sorted, Grouped),
    findall(K-Us, ( member(K-Ts, Grouped), sum_list(Ts, S), Us is round(S / N * 10) / 10 ), Means),
    dict_pairs(D, _, Means),
    json_write_dict(current_output, D), nl,
    (   memberchk(profile, Argv)
    ->  profile(forall(between(200001, 200300, I), run_round(I, _)), [cumulative(true), top(40)])
    ;   true
    ).

add_round(I, Acc, [Total|Acc1]) :-
    run_round(I, Pairs),
    append(Pairs, Acc, Acc1),
    sum_pairs(Pairs, Total).

sum_pairs(Pairs, total-S) :-
    pairs_values(Pairs, Vs), sum_list(Vs, S).

run_round(I, Pairs) :-
    registration_ops(I, Reg),
    teardown_ops(I, Down),
    append(Reg, Down, Ops),
    maplist(timed, Ops, Pairs0),
    append(Pairs0, Pairs).

timed(Op, [Name-Us, reply-ReplyUs]) :-
    functor(Op, Name0, _),
    (   Op = batch([First|_]) -> functor(First, F, _), atom_concat('batch_', F, Name) ; Name = Name0 ),
    statistics(cputime, T0),
    run(Op, Outcome),
    statistics(cputime, T1),
    cod_server:send_outcome(1, Outcome),
    statistics(cputime, T2),
    Us is (T1 - T0) * 1e6,
    ReplyUs is (T2 - T1) * 1e6.
