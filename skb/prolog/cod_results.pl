/*  COD SKB server: the results of operations, written as the JSON of a reply.
*/

:- module(cod_results, [write_result/2]).  % +Stream, +Result
:- use_module(cod_json).

/** <module> Results of the control channel's operations

An operation's result is a term saying what it is (int(N), atom(A),
strings(L), json(Pairs), list(Results), results(Rs), times(L, Cpu),
snapshot(System, Apps), answer(Solutions, Truncated, Us)); write_result/2
writes it as the JSON value of a reply's "ok" (cod_server.pl).  A snapshot
is the journal's, read back by skb/journal.py's compaction.
*/

%!  write_result(+Stream, +Result) is det.
write_result(Out, int(N)) :- write(Out, N).
write_result(Out, atom(A)) :- json_write_text(Out, A).
write_result(Out, strings(L)) :- json_write_value(Out, L).
write_result(Out, json(Pairs)) :- json_write_object(Out, Pairs).
write_result(Out, list(Results)) :-
    put_char(Out, '['),
    write_result_list(Results, Out),
    put_char(Out, ']').
write_result(Out, results(Rs)) :-
    put_char(Out, '['),
    write_results(Rs, Out),
    put_char(Out, ']').
write_result(Out, times(L, Cpu)) :-
    write(Out, '{"wall_us":'),
    json_write_value(Out, L),
    format(Out, ',"cpu_us_per_call":~4f}', [Cpu]).
write_result(Out, snapshot(System, Apps)) :-
    write(Out, '{"system":'),
    json_write_value(Out, System),
    write(Out, ',"apps":{'),
    write_app_states(Apps, Out),
    write(Out, '}}').
write_result(Out, answer(Solutions, Truncated, Us)) :-
    write_answer(Out, answer(Solutions, Truncated, Us)).

write_result_list([], _).
write_result_list([R|T], Out) :-
    write_result(Out, R),
    (   T == [] -> true ; put_char(Out, ','), write_result_list(T, Out) ).

write_results([], _).
write_results([R|T], Out) :-
    write_one_result(Out, R),
    (   T == [] -> true ; put_char(Out, ','), write_results(T, Out) ).

write_one_result(Out, value(V)) :-
    write(Out, '{"value":'), json_write_value(Out, V), put_char(Out, '}').
write_one_result(Out, bindings(Pairs)) :-
    write(Out, '{"bindings":'), json_write_object(Out, Pairs), put_char(Out, '}').
write_one_result(Out, none) :-
    write(Out, '{"none":true}').
write_one_result(Out, skipped) :-
    write(Out, '{"skipped":true}').
write_one_result(Out, error(E)) :-
    write(Out, '{"error":'), write_error_object(Out, E), put_char(Out, '}').

write_app_states([], _).
write_app_states([App-state(Facts, Procs, Declared)|T], Out) :-
    json_write_text(Out, App),
    write(Out, ':{"facts":['),
    write_fact_states(Facts, Out),
    write(Out, '],"procedures":['),
    write_proc_states(Procs, Out),
    write(Out, '],"declared":['),
    write_declared(Declared, Out),
    write(Out, ']}'),
    (   T == [] -> true ; put_char(Out, ','), write_app_states(T, Out) ).

write_fact_states([], _).
write_fact_states([Text-Owners|T], Out) :-
    put_char(Out, '['),
    json_write_text(Out, Text),
    write(Out, ',['),
    write_owners(Owners, Out),
    write(Out, ']]'),
    (   T == [] -> true ; put_char(Out, ','), write_fact_states(T, Out) ).

write_owners([], _).
write_owners([O|T], Out) :-
    (   O = conn(Id) -> write(Out, Id) ; json_write_text(Out, O) ),
    (   T == [] -> true ; put_char(Out, ','), write_owners(T, Out) ).

write_proc_states([], _).
write_proc_states([Text-P|T], Out) :-
    put_char(Out, '['),
    json_write_text(Out, Text),
    format(Out, ',~w]', [P]),
    (   T == [] -> true ; put_char(Out, ','), write_proc_states(T, Out) ).

write_declared([], _).
write_declared([Name/Arity|T], Out) :-
    put_char(Out, '['),
    json_write_text(Out, Name),
    format(Out, ',~w]', [Arity]),
    (   T == [] -> true ; put_char(Out, ','), write_declared(T, Out) ).
