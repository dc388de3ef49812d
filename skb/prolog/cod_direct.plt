/*  plunit tests of the direct query channel's request handling.
*/
:- begin_tests(cod_direct).

:- use_module(cod_direct).

%   A revocation reaches a connection's thread as an asynchronous exception
%   (revoke_token/1), wherever the thread is.  Landing inside the parse of a
%   request, it must end the session, not be reported as the request's error
%   ("frame is not UTF-8 JSON" for a valid frame, as seen once in the suite).
test(revocation_during_a_parse_ends_the_session) :-
    length(Pad, 200000), maplist(=(0'x), Pad),
    format(string(Body), '{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"~s"}}', [Pad]),
    thread_self(Me),
    thread_create(( thread_send_message(Me, parsing),
                    for_five_seconds(( cod_direct:parse_request(Body, Outcome),
                                       Outcome = request(1, "ping", _) )) ),
                  Parser, []),
    thread_get_message(parsing),
    sleep(0.05),
    thread_signal(Parser, throw(cod_revoked)),
    thread_join(Parser, Status),
    assertion(Status == exception(cod_revoked)).

%   The same for the checks of a reply and its writing.
test(revocation_while_a_reply_is_written_ends_the_session, [setup(default_options)]) :-
    thread_self(Me),
    numlist(1, 2000, Ns),
    findall([x-N], member(N, Ns), Solutions),
    open_null_stream(Null),
    set_stream(Null, type(binary)),
    thread_create(( thread_send_message(Me, replying),
                    for_five_seconds(cod_direct:send_result(Null, 1, answer(answer(Solutions, false, 0)))) ),
                  Replier, []),
    thread_get_message(replying),
    sleep(0.05),
    thread_signal(Replier, throw(cod_revoked)),
    thread_join(Replier, Status),
    close(Null),
    assertion(Status == exception(cod_revoked)).

%   for_five_seconds(:Goal): run Goal again and again for five seconds, or
%   until it fails (a revocation swallowed by the code under test must end
%   the test, not hang it).
for_five_seconds(Goal) :-
    get_time(T0),
    forall(( repeat, get_time(T), ( T - T0 > 5 -> !, fail ; true ) ), Goal).

%   The options direct_listen/2 would set, for the tests that do not listen.
default_options :-
    forall(cod_direct:default_option(Name, Value),
           (   cod_direct:direct_option(Name, _)
           ->  true
           ;   assertz(cod_direct:direct_option(Name, Value))
           )).

:- end_tests(cod_direct).
