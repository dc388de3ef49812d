/*  CPU of the direct channel's whole request path, with nothing around it.

    swipl bench/direct_session_profile.pl [N] [profile]

Loads the server's modules (as bench/direct_profile.pl does), gives application
`prof` the fact bench_fact(42) and a capability, and feeds the direct channel's
session loop (cod_direct:session/3) a hello and N single-fact execute_query
frames through a pipe, the replies going to a null stream: the path of one
connection's thread, frames to replies, without the socket, the client or
the scheduler.  Prints the least of 5 rounds of CPU microseconds of this
thread per request; with `profile`, SWI-Prolog's profile of one more round.
*/

:- include(skb_modules).
:- use_module(library(memfile)).
:- use_module(library(unix)).
:- use_module(library(statistics)).

:- initialization(bench_main, main).

bench_main :-
    current_prolog_flag(argv, Argv),
    ( Argv = [A|Rest], atom_number(A, N) -> true ; N = 20000, Rest = [] ),
    pool_init([run(cod_server:pooled_op), died(cod_server:job_died)]),
    grants_init([]),
    start_watchdog,
    forall(cod_direct:direct_default(O, V), assertz(cod_direct:direct_option(O, V))),
    assertz(cod_direct:direct_option(run_query, cod_server:direct_query)),
    add_facts(prof, persistent, ["bench_fact(42)"], none, _),
    grant_token(bench_token, prof, client(daemon, true)),
    frames(N, Frames),
    serve(Frames),                      % warm up: the goal's parse is cached after the first
    findall(Us, ( between(1, 5, _), round_us(Frames, N, Us) ), Rounds),
    min_list(Rounds, Min),
    format("{\"requests\": ~w, \"cpu_us_per_request\": ~2f}~n", [N, Min]),
    (   Rest = [profile|_]
    ->  profile(serve(Frames)), show_profile([top(40), cumulative(true)])
    ;   true
    ).

round_us(Frames, N, Us) :-
    statistics(cputime, T0),
    serve(Frames),
    statistics(cputime, T1),
    Us is (T1 - T0) / N * 1e6.

%   frames(+N, -Frames): a memory file holding a hello and N queries, framed.
frames(N, Frames) :-
    new_memory_file(Frames),
    setup_call_cleanup(
        open_memory_file(Frames, write, W, [encoding(octet)]),
        ( put_frame(W, "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"hello\",\"params\":{\"version\":1,\"token\":\"bench_token\"}}"),
          forall(between(1, N, I),
                 ( format(string(Body), "{\"jsonrpc\":\"2.0\",\"id\":~w,\"method\":\"execute_query\",\"params\":{\"goal\":\"bench_fact(X)\"}}", [I]),
                   put_frame(W, Body) )) ),
        close(W)).

put_frame(W, Body) :-
    string_bytes(Body, Bytes, utf8),
    length(Bytes, Len),
    B0 is (Len >> 24) /\ 0xff, B1 is (Len >> 16) /\ 0xff, B2 is (Len >> 8) /\ 0xff, B3 is Len /\ 0xff,
    maplist(put_byte(W), [B0, B1, B2, B3|Bytes]).

%   serve(+Frames): one session over the frames, through a pipe (the session
%   sets read timeouts, which a memory file does not take), fed by a thread.
serve(Frames) :-
    open_null_stream(Null),
    set_stream(Null, type(binary)),
    pipe(R, W),
    set_stream(R, type(binary)),
    set_stream(W, type(binary)),
    thread_create(feed(Frames, W), Feeder, []),
    catch(cod_direct:session(R, Null, none), E, print_message(error, E)),
    close(R),
    close(Null),
    thread_join(Feeder, _).

feed(Frames, W) :-
    setup_call_cleanup(open_memory_file(Frames, read, In, [encoding(octet)]),
                       copy_stream_data(In, W),
                       close(In)),
    close(W).
