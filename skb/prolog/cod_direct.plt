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
    revoked_during(( cod_direct:parse_request(Body, Outcome),
                     Outcome = request(1, "ping", _) ),
                   Status),
    assertion(Status == exception(cod_revoked)).

%   The same for the checks of a reply and its writing.
test(revocation_while_a_reply_is_written_ends_the_session, [setup(default_options)]) :-
    numlist(1, 2000, Ns),
    findall([x-N], member(N, Ns), Solutions),
    open_null_stream(Null),
    set_stream(Null, type(binary)),
    revoked_during(( cod_direct:result_text(1, answer(answer(Solutions, false, 0)), Text, _),
                     cod_direct:send_text(Null, Text) ),
                   Status),
    close(Null),
    assertion(Status == exception(cod_revoked)).

%   revoked_during(:Goal, -Status): run Goal again and again in a thread of
%   its own, revoke it as revoke_token/1 does once it is well under way, and
%   give the thread's exit status: exception(cod_revoked) when the
%   revocation ended it, true or false when Goal swallowed it.
revoked_during(Goal, Status) :-
    thread_self(Me),
    thread_create(( thread_send_message(Me, started), for_five_seconds(Goal) ), Thread, []),
    thread_get_message(started),
    sleep(0.05),
    thread_signal(Thread, throw(cod_revoked)),
    thread_join(Thread, Status).

%   for_five_seconds(:Goal): run Goal again and again for five seconds, or
%   until it fails (a revocation swallowed by the code under test must end
%   the test, not hang it).
for_five_seconds(Goal) :-
    get_time(T0),
    forall(( repeat, get_time(T), ( T - T0 > 5 -> !, fail ; true ) ), Goal).

%   The options direct_listen/2 would set, for the tests that do not listen.
default_options :-
    forall(cod_direct:direct_default(Name, Value),
           (   cod_direct:direct_option(Name, _)
           ->  true
           ;   assertz(cod_direct:direct_option(Name, Value))
           )).

:- end_tests(cod_direct).
