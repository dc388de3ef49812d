/*  plunit tests of application namespaces: names, facts, owners, quotas, procedures, queries.
*/
:- begin_tests(cod_apps).

:- use_module(cod_apps).

test(names, [forall(member(N, ['pg-main', 'PostgreSQL 16', 'Zürich', 'duckdb.worker-1']))]) :-
    valid_app_name(N).

test(bad_names, [forall(member(N, ['', 'a\nb', 'tab\there', 'é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é_é']))]) :-
    \+ valid_app_name(N).

test(facts_are_ground, [error(domain_error(ground_fact, _), _)]) :-
    add_facts(plunit_a, persistent, ["city(X)"], none, _).

test(operator_facts_are_refused, [error(domain_error(operator_fact, _), _)]) :-
    add_facts(plunit_a, persistent, ["db-rtime(3000)"], none, _).

test(owners_hold_facts) :-
    add_facts(plunit_b, conn(1), ["cfg(1)", "cfg(2)"], none, 2),
    add_facts(plunit_b, conn(2), ["cfg(3)", "cfg(1)"], none, 1),
    drop_owner(plunit_b, conn(2), Removed),
    Removed == 1,
    list_facts(plunit_b, cfg/1, Texts),
    Texts == ["cfg(1)", "cfg(2)"].

test(removal_unifies) :-
    add_facts(plunit_c, persistent, ["price(apple,3)", "price(pear,4)"], none, 2),
    remove_facts(plunit_c, ["price(apple,_)"], 1),
    list_facts(plunit_c, all, ["price(pear,4)"]).

test(quota, [error(resource_error(cod_quota(facts, 2)), _)]) :-
    add_facts(plunit_d, persistent, ["q(1)", "q(2)", "q(3)"], limits(2, 1000, 10, 1000), _).

test(quota_refusal_changes_nothing) :-
    catch(add_facts(plunit_e, persistent, ["q(1)", "q(2)", "q(3)"], limits(2, 1000, 10, 1000), _), _, true),
    app_usage(plunit_e, usage(F, _, _, _)),
    F =< 3.    % outside a transaction the facts stay; the server runs every write in one

test(procedure_replaces_its_predicates) :-
    add_procedure(plunit_f, "p(1). p(2).", false, none, ['p'/1]),
    add_procedure(plunit_f, "p(3).", false, none, _),
    run_query(plunit_f, "p(X)", [], answer(S, false, _)),
    S == [['X'-3]].

test(query_qualification_in_data_is_data) :-
    run_query(plunit_g, "X = time(12:30)", [], answer([['X'-time(12:30)]], false, _)).

test(query_qualification_in_goals_is_refused, [error(permission_error(call, module_qualified, _), _)]) :-
    run_query(plunit_g, "lists:append(X, Y, [1])", [], _).

test(a_repeated_query_gets_fresh_variables_each_run) :-
    add_facts(plunit_h, persistent, ["r(1)", "r(2)"], none, 2),
    run_query(plunit_h, "r(X), Y = f(X, _Z)", [], answer(S1, false, _)),
    run_query(plunit_h, "r(X), Y = f(X, _Z)", [], answer(S2, false, _)),
    S1 = [['X'-1, 'Y'-f(1, A)], ['X'-2, 'Y'-f(2, B)]], var(A), var(B),
    S2 = [['X'-1, 'Y'-f(1, C)], ['X'-2, 'Y'-f(2, D)]], var(C), var(D), C \== A.

test(the_same_text_in_another_application_reads_that_applications_facts) :-
    add_facts(plunit_i, persistent, ["s(i)"], none, 1),
    add_facts(plunit_j, persistent, ["s(j)"], none, 1),
    run_query(plunit_i, "s(X)", [], answer([['X'-i]], false, _)),
    run_query(plunit_j, "s(X)", [], answer([['X'-j]], false, _)).

test(a_repeated_query_is_checked_by_the_sandbox_each_run,
     [error(permission_error(call, module_qualified, _), _)]) :-
    catch(run_query(plunit_k, "lists:append(X, Y, [1])", [], _), _, true),
    run_query(plunit_k, "lists:append(X, Y, [1])", [], _).

% The libraries' exports, inherited from cod_app_libraries: predicates, clpfd's operators in the
% query text and in procedures, and no redefinition of them (the error names the library).
test(an_application_sees_the_libraries_predicates_and_operators) :-
    run_query(plunit_l, "X #= 3 + 4, append([1], [X], L), foldl(plus, L, 0, S), pairs_keys([k-v], K)",
              [], answer([Sol], false, _)),
    Sol == ['X'-7, 'L'-[1, 7], 'S'-8, 'K'-[k]],
    add_procedure(plunit_l, "seven(X) :- X #= 3 + 4.", false, none, _),
    run_query(plunit_l, "seven(Y)", [], answer([['Y'-7]], false, _)).

test(an_application_may_not_redefine_a_library_predicate,
     [forall(member(Text, ["append(_, _, _).", "foldl(_, _, _, _).", "transpose(_, _).", "pairs_keys(_, _)."]))]) :-
    catch(add_procedure(plunit_m, Text, false, none, _), E, true),
    nonvar(E),
    E = error(permission_error(modify, static_procedure, _), _).

test(a_new_application_inherits_from_the_libraries_module_first) :-
    app_module(plunit_n, M),
    findall(S, import_module(M, S), Supers),
    Supers = [cod_app_libraries, cod_sys|_],
    last(Supers, system),
    \+ memberchk(user, Supers).

test(a_snapshot_holds_every_application_that_holds_anything) :-
    % Issue 47: a cut kept app_snapshot/2 to the first application that held anything.
    add_facts(plunit_snap_a, persistent, ["s(1)"], none, _),
    add_facts(plunit_snap_b, conn(7), ["s(2)"], none, _),
    add_procedure(plunit_snap_c, "sp(1).", true, none, _),
    add_facts(plunit_snap_d, persistent, ["gone(1)"], none, _),
    remove_facts(plunit_snap_d, ["gone(_)"], 1),
    findall(App-State, ( app_snapshot(App, State), sub_atom(App, 0, _, _, plunit_snap_) ), Pairs),
    msort(Pairs, Sorted),
    Sorted == [ plunit_snap_a-state(["s(1)"-[persistent]], [], []),
                plunit_snap_b-state(["s(2)"-[conn(7)]], [], []),
                plunit_snap_c-state([], ["sp(1).\n"-true], []),
                plunit_snap_d-state([], [], [gone/1]) ].

test(a_restored_application_is_the_one_snapshotted) :-
    add_facts(plunit_snap_e, conn(3), ["r(1)"], none, _),
    add_facts(plunit_snap_e, persistent, ["r(1)", "r(2)"], none, _),
    add_facts(plunit_snap_e, persistent, ["empty(1)"], none, _),
    remove_facts(plunit_snap_e, ["empty(_)"], 1),
    add_procedure(plunit_snap_e, "twice(Y) :- r(X), Y is 2*X.", false, none, _),
    app_snapshot(plunit_snap_e, State),
    drop_app(plunit_snap_e),
    restore_app(plunit_snap_e, State),
    app_snapshot(plunit_snap_e, Again),
    Again == State.

test(a_restored_declaration_may_not_name_a_library_predicate,
     [error(permission_error(modify, static_procedure, _), _)]) :-
    restore_app(plunit_snap_f, state([], [], [append/3])).

test(internals_are_refused_by_name, [error(permission_error(call, sandboxed, '$search_path_file_cache'/3), _)]) :-
    run_query(plunit_internal, "'$search_path_file_cache'(A, B, C)", [], _).

test(internals_as_closures_are_refused_by_name, [error(permission_error(call, sandboxed, '$member'/2), _)]) :-
    run_query(plunit_internal, "maplist('$member'(X), [[1]])", [], _).

% A round of evaluations is bounded: once round_limit has passed no query starts (skipped), so an
% application's many slow conditions take one round's time, not the sum of their time limits.
test(an_evaluation_round_starts_no_query_after_its_limit) :-
    Slow = first("\\+ (between(1, 5000000, X), X < 0)"),
    length(Queries, 40), maplist(=(Slow), Queries),
    get_time(T0),
    evaluate(plunit_o, [], [first("Y = 1")|Queries], [time_limit(0.05), round_limit(0.1)], Results),
    get_time(T1),
    T1 - T0 < 1.0,
    Results = [bindings(['Y'-1])|Rest],
    memberchk(skipped, Rest),
    last(Rest, skipped).

test(an_evaluation_without_a_round_limit_runs_every_query) :-
    evaluate(plunit_p, [], [first("Y = 1"), first("fail")], [time_limit(0.5)], Results),
    Results == [bindings(['Y'-1]), none].

:- end_tests(cod_apps).
