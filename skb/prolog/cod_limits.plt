/*  plunit tests of cod_limits.pl: a client that is gone (abandon_tagged/2).
*/
:- begin_tests(cod_limits).

:- use_module(cod_limits).

test(an_abandoned_tag_is_remembered_and_no_other) :-
    abandon_tagged(plunit_gone_tag, Running),
    assertion(Running == 0),
    assertion(abandoned(plunit_gone_tag)),
    assertion(\+ abandoned(plunit_other_tag)),
    assertion(\+ abandoned(none)).

test(abandoning_twice_remembers_once) :-
    abandon_tagged(plunit_twice_tag, _),
    abandon_tagged(plunit_twice_tag, _),
    aggregate_all(count, cod_limits:abandoned_tag(plunit_twice_tag), N),
    assertion(N == 1).

%   A query of a client that is gone, still queued when it leaves, is answered without running.
test(a_queued_query_of_an_abandoned_client_does_not_run) :-
    abandon_tagged(plunit_queued_tag, _),
    nb_setval(plunit_ran, false),
    cod_server:op_outcome(query(plunit_app, "nb_setval(plunit_ran, true)", [tag(plunit_queued_tag)]), Outcome),
    assertion(Outcome == error(cod_limit(cancelled))),
    nb_getval(plunit_ran, Ran),
    assertion(Ran == false).

test(abandon_wants_an_atom, error(type_error(atom, 42))) :-
    abandon_tagged(42, _).

%   The deadline table was the recorded database: with the watchdog enumerating its key
%   every tick, SWI-Prolog 9.0 never reclaimed the erased records (10 MB per 100,000 calls).
test(limited_calls_leave_no_memory_behind) :-
    start_watchdog,
    forall(between(1, 1000, _), run_limited(true, 5, 1000000)),   % warm up
    rss_kb(Before),
    forall(between(1, 50000, _), run_limited(true, 5, 1000000)),
    rss_kb(After),
    Growth is After - Before,
    assertion(Growth < 2048).

%   Queries run their limited call inside snapshot/1 (cod_apps.pl): the watchdog must see
%   the deadline there, and live on.
test(a_time_limit_holds_inside_a_snapshot, throws(cod_limit(time))) :-
    start_watchdog,
    snapshot(run_limited((repeat, sleep(0.01), fail), 0.2, 100000000000)).

test(the_watchdog_lives_on_after_limits_fired) :-
    start_watchdog,
    catch(snapshot(run_limited((repeat, sleep(0.01), fail), 0.1, 100000000000)), cod_limit(time), true),
    thread_create(run_limited((repeat, sleep(0.01), fail), 0.1, 100000000000), T, []),
    thread_join(T, Status),
    assertion(Status == exception(cod_limit(time))),
    assertion(thread_property(cod_watchdog, status(running))).

rss_kb(KB) :-
    read_file_to_string('/proc/self/status', Text, []),
    split_string(Text, "\n", "", Lines),
    member(Line, Lines),
    string_concat("VmRSS:", Rest, Line), !,
    split_string(Rest, " \t", " \t", [Number|_]),
    number_string(KB, Number).

:- end_tests(cod_limits).
