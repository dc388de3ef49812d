/*  COD SKB: the direct query channel.
*/

:- module(cod_direct,
          [ direct_listen/2,         % +SocketPath, +Options
            direct_default/2,        % ?Name, ?Default
            grant_token/2,           % +Token, +App
            grant_token/3,           % +Token, +App, +Client
            revoke_token/1           % +Token
          ]).
:- use_module(library(socket)).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(option)).
:- use_module(library(aggregate)).
:- use_module(library(http/json)).
:- use_module(cod_json).
:- use_module(cod_frames).
:- use_module(cod_errors).
:- use_module(cod_grants).

/** <module> Queries in one hop

A client first says `hello` to the Resource Manager, which grants it a
capability: a random token bound to the client's application
(grant_token/2, through the control channel).  The client then connects to
this socket, sends `hello` with the token, and runs `execute_query` here,
without the Resource Manager in between.  The token dies with the client's
connection to the Resource Manager (revoke_token/1): later requests are
refused, and a query running for that token is stopped.

Framing and messages are those of the Resource Manager's socket
(docs/protocol.md): a 4-byte big-endian length, then that many bytes of
UTF-8 JSON-RPC 2.0.  A query here runs in exactly the namespace, sandbox,
slots and limits of the same query sent through the Resource Manager: the
query itself is run by the server's run_query hook (cod_server.pl).

One thread per connection: a slow or runaway client costs its own thread.
Before `hello` a connection has hello_timeout seconds; once a frame has
begun, its remaining bytes must arrive within frame_timeout seconds; a
greeted connection that sends nothing for idle_timeout seconds is closed
(each close is told to the client first: one error frame with the reason),
and so is one that reads nothing of an answer for write_timeout seconds.

Connections per uid.  A token names its client, client(Uid, Privileged)
(grant_token/3; the Resource Manager knows the peer's credentials).  At
most max_pending connections wait for their hello at once (a new one
closes the oldest: the one who waits longest is the one who sends
nothing); at its hello a connection of an unprivileged uid is refused
(error -32070, then closed) when its uid already holds
max_connections_per_uid of them, or when unprivileged uids together hold
max_connections - reserved_privileged_connections - max_pending.  So the
connections of root and the daemon's user always fit.
*/

:- dynamic
    token/3,               % Token, App, Client
    conn_token/2,          % Thread, Token
    conn_state/2,          % Thread, pending(Since) or Client
    direct_option/2.       % Name, Value

:- meta_predicate direct_listen(+, :).

%!  direct_default(?Name, ?Default) is nondet.
%
%   The channel's settings and their defaults: the options of
%   direct_listen/2, and the SKB server's command-line settings of the
%   same names.
direct_default(max_connections, 1024).
direct_default(max_frame_bytes, 1048576).
direct_default(hello_timeout, 5).
direct_default(idle_timeout, 120).              % a greeted connection silent for this long is closed
direct_default(write_timeout, 10).              % a connection that reads nothing of an answer this long is closed
direct_default(max_connections_per_uid, 64).    % of an unprivileged uid
direct_default(reserved_privileged_connections, 64). % of max_connections, for root and the daemon
direct_default(max_pending, 64).                % connections waiting for their hello
direct_default(frame_timeout, 10).
direct_default(max_time_limit, 5).
direct_default(inference_limit, 10000000).
direct_default(rpc_codes, '').

%!  direct_listen(+Path, :Options) is det.
%
%   Listen on the Unix socket Path.  Options: run_query(:Closure), called
%   as call(Closure, App, GoalText, QueryOptions, Answer), and the
%   settings of direct_default/2.
direct_listen(Path, M:Options) :-
    forall(direct_default(Name, Default),
           (   Opt =.. [Name, Value],
               option(Opt, Options, Default),
               retractall(direct_option(Name, _)),
               assertz(direct_option(Name, Value))
           )),
    option(run_query(Run), Options),
    retractall(direct_option(run_query, _)),
    assertz(direct_option(run_query, M:Run)),
    catch(delete_file(Path), _, true),     % a socket left by an engine that died
    unix_domain_socket(Socket),
    tcp_bind(Socket, Path),
    tcp_listen(Socket, 128),
    tcp_open_socket(Socket, AcceptFd, _),
    thread_create(accept_loop(AcceptFd), _,
                  [alias(cod_direct_acceptor), detached(true)]).

%!  grant_token(+Token, +App) is det.
%!  grant_token(+Token, +App, +Client) is det.
%
%   Token opens App's queries to the client Client, client(Uid,
%   Privileged); a token granted without a client is the daemon's own.
grant_token(Token, App) :-
    grant_token(Token, App, client(daemon, true)).
grant_token(Token, App, Client) :-
    must_be(atom, Token),
    must_be(atom, App),
    (   Client = client(Uid, P), ( Uid == daemon ; integer(Uid), Uid >= 0 ), must_be(boolean, P)
    ->  true
    ;   domain_error(cod_client, Client)
    ),
    retractall(token(Token, _, _)),
    assertz(token(Token, App, Client)).

%!  revoke_token(+Token) is det.
%
%   The token is no longer valid; connections using it are closed (a
%   query they run is stopped).
revoke_token(Token) :-
    retractall(token(Token, _, _)),
    forall(conn_token(Thread, Token),
           catch(thread_signal(Thread, throw(cod_revoked)), _, true)).

%   not_revoked(+E): rethrow E if it is a revocation.  It arrives as an
%   asynchronous exception (thread_signal/2 above), so it can land inside
%   any catch/3 of a connection's thread; there it must end the session,
%   never become the error of the request being read or answered.
not_revoked(E) :-
    (   ( E == cod_revoked ; E == cod_evicted )
    ->  throw(E)
    ;   true
    ).

accept_loop(AcceptFd) :-
    repeat,
    catch(tcp_accept(AcceptFd, Socket, _Peer), E, (print_message(warning, E), fail)),
    get_time(Accepted),   % the order of arrival: threads may start in another order
    direct_option(max_connections, Max),
    flag(cod_direct_connections, N, N),
    (   N >= Max
    ->  tcp_close_socket(Socket)
    ;   make_room_for_hello,
        flag(cod_direct_connections, N1, N1+1),
        client_thread_options(ThreadOptions),
        catch(thread_create(serve_connection(Socket, Accepted), _,
                            [detached(true)|ThreadOptions]),
              _,
              ( flag(cod_direct_connections, N2, N2-1),
                tcp_close_socket(Socket) ))
    ),
    fail.

%   make_room_for_hello: at most max_pending connections wait for their
%   hello; the one waiting longest is closed for a new one.
make_room_for_hello :-
    direct_option(max_pending, Max),
    with_mutex(cod_direct_conns,
               (   aggregate_all(count, conn_state(_, pending(_)), N),
                   N >= Max,
                   aggregate_all(min(Since, T), conn_state(T, pending(Since)), min(_, Oldest))
               ->  retract(conn_state(Oldest, _))
               ;   Oldest = none
               )),
    (   Oldest == none
    ->  true
    ;   catch(thread_signal(Oldest, throw(cod_evicted)), _, true)
    ).

serve_connection(Socket, Accepted) :-
    thread_self(Me),
    with_mutex(cod_direct_conns, assertz(conn_state(Me, pending(Accepted)))),
    setup_call_cleanup(
        tcp_open_socket(Socket, Pair),
        serve_pair(Pair),
        close_connection(Pair)).

close_connection(Pair) :-
    thread_self(Me),
    retractall(conn_token(Me, _)),
    with_mutex(cod_direct_conns, retractall(conn_state(Me, _))),
    flag(cod_direct_connections, N, N-1),
    catch(close(Pair, [force(true)]), _, true).

serve_pair(Pair) :-
    stream_pair(Pair, In, Out),
    set_stream(In, type(binary)),
    set_stream(Out, type(binary)),
    % A client that reads nothing of an answer for write_timeout seconds is
    % closed: its thread and the answer it holds are not kept for ever.
    direct_option(write_timeout, WT),
    set_stream(Out, timeout(WT)),
    catch(session(In, Out, none), E, session_ended(E, Out)).

session_ended(cod_evicted, Out) :- !,
    direct_option(max_pending, Max),
    format(string(Msg), "no hello yet, and ~w newer connections wait for theirs; closing", [Max]),
    catch(send_error(Out, null, -32000, Msg, []), _, true).
session_ended(cod_idle(hello, T), Out) :- !,
    format(string(Msg), "no hello within ~w s; closing", [T]),
    catch(send_error(Out, null, -32000, Msg, []), _, true).
session_ended(cod_idle(idle, T), Out) :- !,
    format(string(Msg), "no request for ~w s (idle_timeout); closing", [T]),
    catch(send_error(Out, null, -32071, Msg, []), _, true).
session_ended(E, _) :-
    session_ended(E).

session_ended(cod_revoked) :- !.
session_ended(cod_close) :- !.
session_ended(error(io_error(_, _), _)) :- !.
session_ended(error(timeout_error(_, _), _)) :- !.
session_ended(error(existence_error(stream, _), _)) :- !.
session_ended(_).

%   session(+In, +Out, +App): serve frames until end of file; App is
%   `none` until a valid hello.
session(In, Out, App) :-
    (   App == none
    ->  direct_option(hello_timeout, T0), Why = hello
    ;   direct_option(idle_timeout, T0), Why = idle
    ),
    set_stream(In, timeout(T0)),
    catch(get_byte(In, B0), error(timeout_error(_, _), _), throw(cod_idle(Why, T0))),
    (   B0 == -1
    ->  true
    ;   direct_option(frame_timeout, FT),
        set_stream(In, timeout(FT)),
        % once/1: no choice point of one request may survive into the next
        % (the recursion would keep every request's frame; see worker_loop/0).
        once(read_frame(In, B0, Outcome)),
        once(handle(Outcome, Out, App, App1)),
        session(In, Out, App1)
    ).

read_frame(In, B0, Outcome) :-
    direct_option(max_frame_bytes, Max),
    read_frame_json(In, B0, Max, Frame),
    frame_outcome(Frame, Max, Outcome).

frame_outcome(closed, _, _) :-
    throw(cod_close).
frame_outcome(too_big(Size), Max, fatal(-32600, Msg)) :-
    format(string(Msg), "frame of ~w bytes exceeds the limit of ~w bytes", [Size, Max]).
frame_outcome(json(Dict), _, Outcome) :-
    request_parts(Dict, Outcome).
frame_outcome(text(Body), _, Outcome) :-
    parse_request(Body, Outcome).

%   parse_request(+Body, -Outcome): a request's text that the frame reader
%   left to library(http/json) (cod_frames.pl).
parse_request(Body, Outcome) :-
    (   catch(atom_json_dict(Body, Dict, [value_string_as(string), tag('')]), E, true)
    ->  true
    ;   E = failed
    ),
    (   var(E)
    ->  request_parts(Dict, Outcome)
    ;   not_revoked(E),
        Outcome = error(null, -32700, "frame is not UTF-8 JSON")
    ).

request_parts(Dict, Outcome) :-
    (   is_dict(Dict)
    ->  (   get_dict(id, Dict, Id0) -> Id = Id0 ; Id = null ),
        (   \+ valid_id(Id)
        ->  Outcome = error(null, -32600, "request id must be an integer or a string")
        ;   get_dict(jsonrpc, Dict, "2.0"),
            get_dict(method, Dict, Method), string(Method)
        ->  (   get_dict(params, Dict, Params0) -> true ; Params0 = _{} ),
            (   Params0 == null -> Params = _{} ; Params = Params0 ),
            (   is_dict(Params)
            ->  Outcome = request(Id, Method, Params)
            ;   Outcome = error(Id, -32600, "\"params\" must be an object (by-name parameters)")
            )
        ;   Outcome = error(Id, -32600, "request must carry \"jsonrpc\": \"2.0\" and a \"method\" string")
        )
    ;   Outcome = error(null, -32600, "a request must be a JSON object")
    ).

valid_id(null).
valid_id(Id) :- integer(Id).
valid_id(Id) :- string(Id).

handle(fatal(Code, Msg), Out, _, _) :-
    send_error(Out, null, Code, Msg, []),
    throw(cod_close).
handle(error(Id, Code, Msg), Out, App, App) :-
    send_error(Out, Id, Code, Msg, []).
handle(request(Id, Method, Params), Out, App0, App) :-
    %   Answered under the thread's small stacks, or made again under a large
    %   grant (cod_grants.pl), which keeps no binding: only a query needs one,
    %   and a query leaves App as it was.
    with_stack_grant(request_reply(Id, Method, Params, App0, App, Reply),
                     send_reply(Out, Reply),
                     send_engine_error(Out, Id)),
    (   var(App) -> App = App0 ; true ).

%   request_reply(+Id, +Method, +Params, +App0, -App, -Reply, -Outgrew): the
%   reply to a request, its text made (the stacks it takes are the request's);
%   Outgrew is true when that ran out of stack.
request_reply(Id, Method, Params, App0, App, Reply, Outgrew) :-
    catch(method(Method, Params, App0, App, Result), E, true),
    (   var(E)
    ->  result_text(Id, Result, Text, Outgrew),
        Reply = frame(Text)
    ;   App = App0,
        error_reply(Id, E, Reply),
        outgrown(E, Outgrew)
    ).

error_reply(_, E, rethrow(E)) :-
    ( E == cod_revoked ; E == cod_evicted ), !.
error_reply(Id, rpc(Code, Msg, Data), frame(Text)) :- !,
    error_text(Id, Code, Msg, Data, Text).
error_reply(Id, rpc_close(Code, Msg), last_frame(Text)) :- !,
    error_text(Id, Code, Msg, [], Text).
error_reply(Id, E, frame(Text)) :-
    engine_error_text(Id, E, Text).

send_reply(Out, frame(Text)) :-
    send_text(Out, Text).
send_reply(Out, last_frame(Text)) :-
    send_text(Out, Text),
    throw(cod_close).
send_reply(_, rethrow(E)) :-
    throw(E).

%   method(+Name, +Params, +App0, -App, -Result)
method("hello", Params, _, App, json([protocol-1, app-App])) :- !,
    check_params("hello", Params, [version, token, client]),
    (   get_dict(version, Params, V) -> true ; V = none ),
    (   V == 1
    ->  true
    ;   throw(rpc(-32001, "protocol version is not supported; this SKB speaks 1", [supported-[1]]))
    ),
    (   get_dict(token, Params, T), string(T), atom_string(Token, T), token(Token, App, Client)
    ->  thread_self(Me),
        admit(Me, Client),
        retractall(conn_token(Me, _)),
        assertz(conn_token(Me, Token)),
        nb_setval(cod_tag, Token),
        nb_setval(cod_client, Client)
    ;   throw(rpc(-32010, "this capability is not valid (its connection to the Resource Manager has ended, or it was never issued)", []))
    ).
method(_, _, none, _, _) :- !,
    throw(rpc(-32000, "send 'hello' with your capability first", [])).
method(_, _, App, _, _) :-
    thread_self(Me),
    \+ ( conn_token(Me, Token), token(Token, App, _) ), !,
    throw(rpc(-32010, "this capability is not valid (its connection to the Resource Manager has ended, or it was never issued)", [])).
method("ping", _, App, App, atom(pong)) :- !.
method("execute_query", Params, App, App, answer(Answer)) :- !,
    check_params("execute_query", Params, [goal, all_solutions, max_solutions, timeout_s]),
    (   get_dict(goal, Params, Goal), string(Goal)
    ->  true
    ;   throw(rpc(-32602, "execute_query: parameter 'goal' must be a string", []))
    ),
    param_bool(Params, all_solutions, true, All),
    param_int(Params, max_solutions, 10000, MaxSol),
    (   between(1, 10000, MaxSol)
    ->  true
    ;   throw(rpc(-32602, "execute_query: max_solutions must be 1..10000", []))
    ),
    direct_option(max_time_limit, MaxT),
    param_time(Params, MaxT, Time),
    direct_option(inference_limit, Inf),
    direct_option(run_query, Run),
    nb_getval(cod_client, client(Uid, Priv)),
    (   Uid == daemon -> Whom = [] ; Whom = [uid(Uid), privileged(Priv)] ),
    call(Run, App, Goal, [all(All), max_solutions(MaxSol), time_limit(Time), inference_limit(Inf)|Whom],
         Answer).
method(Other, _, _, _, _) :-
    format(string(M), "unknown method ~q; known: execute_query, hello, ping", [Other]),
    throw(rpc(-32601, M, [])).

%   admit(+Thread, +Client): Thread's connection now serves Client, unless
%   Client's uid holds its share of connections already (rpc_close/2:
%   refused, then closed).
admit(Me, Client) :-
    with_mutex(cod_direct_conns,
               (   refusal(Me, Client, Why)
               ->  true
               ;   retractall(conn_state(Me, _)),
                   assertz(conn_state(Me, Client)),
                   Why = none
               )),
    (   Why == none
    ->  true
    ;   throw(rpc_close(-32070, Why))
    ).

refusal(Me, client(Uid, false), Why) :-
    direct_option(max_connections_per_uid, PerUid),
    aggregate_all(count, ( conn_state(T, client(Uid, _)), T \== Me ), N),
    N >= PerUid, !,
    format(string(Why), "uid ~w already holds ~w direct connections (max_connections_per_uid); closing", [Uid, N]).
refusal(Me, client(_, false), Why) :-
    direct_option(max_connections, Max),
    direct_option(reserved_privileged_connections, Reserved),
    direct_option(max_pending, Pending),
    Ceiling is max(1, Max - Reserved - Pending),
    aggregate_all(count, ( conn_state(T, client(_, false)), T \== Me ), N),
    N >= Ceiling,
    format(string(Why), "unprivileged uids hold ~w direct connections, all those not kept for root and the daemon; closing", [N]).

check_params(Method, Params, Known) :-
    dict_keys(Params, Keys),
    subtract(Keys, Known, Unknown),
    (   Unknown == []
    ->  true
    ;   atomic_list_concat(Unknown, ', ', U),
        format(string(M), "~w: unknown parameter(s): ~w", [Method, U]),
        throw(rpc(-32602, M, []))
    ).

dict_keys(Dict, Keys) :-
    dict_pairs(Dict, _, Pairs),
    pairs_keys(Pairs, Keys).

param_bool(Params, Key, Default, Value) :-
    (   get_dict(Key, Params, V), V \== null
    ->  (   memberchk(V, [true, false])
        ->  Value = V
        ;   format(string(M), "execute_query: parameter '~w' must be a boolean", [Key]),
            throw(rpc(-32602, M, []))
        )
    ;   Value = Default
    ).

param_int(Params, Key, Default, Value) :-
    (   get_dict(Key, Params, V), V \== null
    ->  (   integer(V)
        ->  Value = V
        ;   format(string(M), "execute_query: parameter '~w' must be an integer", [Key]),
            throw(rpc(-32602, M, []))
        )
    ;   Value = Default
    ).

param_time(Params, Max, Time) :-
    (   get_dict(timeout_s, Params, V), V \== null
    ->  (   number(V), V > 0, V < inf
        ->  Time is min(V, Max)
        ;   throw(rpc(-32602, "execute_query: timeout_s must be a finite positive number", []))
        )
    ;   Time = Max
    ).

		 /*******************************
		 *           REPLIES            *
		 *******************************/

%   result_text(+Id, +Result, -Text, -Outgrew): the frame's text of a result,
%   or of the error it became (an answer too large, or too large to write
%   with the stacks at hand: Outgrew).
result_text(Id, Result, Text, Outgrew) :-
    (   Result = answer(answer(Solutions, _, _))
    ->  direct_option(max_frame_bytes, Max),
        catch(answer_size_within(Solutions, Max), TooBig, true)
    ;   true
    ),
    (   nonvar(TooBig)
    ->  not_revoked(TooBig),
        failure_text(Id, TooBig, Text, Outgrew)
    ;   catch(with_output_to(string(Text0),
                             ( write('{"jsonrpc":"2.0","id":'),
                               write_id(Id),
                               write(',"result":'),
                               write_direct_result(Result),
                               write('}') )),
              E, true)
    ->  (   var(E)
        ->  Text = Text0, Outgrew = false
        ;   not_revoked(E),
            failure_text(Id, E, Text, Outgrew)
        )
    ;   failure_text(Id, error(failed(reply), _), Text, Outgrew)
    ).

failure_text(Id, E, Text, Outgrew) :-
    outgrown(E, Outgrew),
    engine_error_text(Id, E, Text).

write_direct_result(atom(A)) :- json_write_text(current_output, A).
write_direct_result(json(Pairs)) :- json_write_object(current_output, Pairs).
write_direct_result(answer(answer(Solutions, _Truncated, _Us))) :-
    % The same result as the Resource Manager's execute_query.
    write('{"solutions":['),
    write_solutions(Solutions),
    write(']}').

write_solutions([]).
write_solutions([S|T]) :-
    json_write_object(current_output, S),
    (   T == [] -> true ; put_char(','), write_solutions(T) ).

write_id(null) :- !, write(null).
write_id(Id) :- integer(Id), !, write(Id).
write_id(Id) :- json_write_text(current_output, Id).

send_error(Out, Id, Code, Msg, Data) :-
    error_text(Id, Code, Msg, Data, Text),
    send_text(Out, Text).

send_engine_error(Out, Id, E) :-
    engine_error_text(Id, E, Text),
    send_text(Out, Text).

error_text(Id, Code, Msg, Data, Text) :-
    with_output_to(string(Text),
                   ( write('{"jsonrpc":"2.0","id":'),
                     write_id(Id),
                     format(',"error":{"code":~w,"message":', [Code]),
                     json_write_text(current_output, Msg),
                     (   Data == []
                     ->  true
                     ;   write(',"data":'), json_write_object(current_output, Data)
                     ),
                     write('}}') )).

engine_error_text(Id, E, Text) :-
    error_code(E, SkbCode),
    error_message(E, Msg),
    error_data(E, Data0),
    rpc_code(SkbCode, Code),
    append(Data0, [skb_code-SkbCode], Data),
    error_text(Id, Code, Msg, Data, Text).

%   rpc_code(+SkbCode, -RpcCode): the protocol's number for an SKB error
%   code.  The table comes from the Resource Manager (--rpc-codes), which
%   owns the protocol's numbers.
rpc_code(SkbCode, Code) :-
    direct_option(rpc_codes, Table),
    atomic_list_concat(Entries, ',', Table),
    (   member(Entry, Entries),
        atomic_list_concat([Name, Num], '=', Entry),
        atom_string(Name, S), atom_string(SkbCode, S)
    ->  atom_number(Num, Code)
    ;   Code = -32050
    ).

%   send_text(+Out, +Text): Text as one frame (cod_frames.pl).  A body
%   over the frame limit becomes an error reply for this request
%   (answer_size_within/2 has bounded the text before it is made).
send_text(Out, Text) :-
    direct_option(max_frame_bytes, Max),
    write_frame(Out, Text, Max).
