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

:- end_tests(cod_limits).
