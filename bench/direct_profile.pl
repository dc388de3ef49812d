/*  Where the microseconds of one direct query go inside the SKB server.

    swipl bench/direct_profile.pl [N]

Loads the server's modules (as cod_server.pl does, without its channels),
gives application `prof` the fact bench_fact(42), and times, N times each,
every step that a single-fact execute_query takes on the direct channel
(cod_direct.pl, cod_server.pl, cod_apps.pl, cod_pool.pl, cod_limits.pl),
one step at a time with the others left out.  Prints one JSON object:
CPU microseconds of this thread per call (so that other processes on a
shared machine do not count), the least of 7 rounds of N calls.
Steps marked _before are the implementations replaced by issue 31, kept
here to compare in one run (_prolog: cod_frames.pl's Prolog reader and
writer, used when its C library is not built); query_goal_not_cached is a query whose parse
the thread has not kept (its first run, or another text).
*/

:- include(skb_modules).
:- use_module(library(http/json)).
:- use_module(library(memfile)).
:- use_module(library(http/http_stream)).

:- initialization(main, main).

body('{"jsonrpc":"2.0","id":1,"method":"execute_query","params":{"goal":"bench_fact(X)"}}').

main :-
    current_prolog_flag(argv, Argv),
    ( Argv = [A|_], atom_number(A, N) -> true ; N = 20000 ),
    autoload_all,
    pool_init([run(cod_server:run_op), died(cod_server:job_died)]),
    start_watchdog,
    forall(member(O-V, [max_frame_bytes-1048576, rpc_codes-'']),
           assertz(cod_direct:direct_option(O, V))),
    add_facts(prof, persistent, ["bench_fact(42)"], none, _),
    body(Body),
    atom_string(Body, BodyS),
    atom_length(Body, Len),
    frame_text(Body, Len, Frame),
    open_null_stream(Null),
    set_stream(Null, type(binary)),
    Opts = [all(true), max_solutions(10000), time_limit(5), inference_limit(10000000)],
    run_query(prof, "bench_fact(X)", Opts, answer(Sols, _, _)),
    Steps = [ step(open_string_only, open_only(Frame)),
              step(read_frame_json_c, read_frame_with(cod_frames:read_frame_json, Frame)),
              step(read_frame_json_prolog, read_frame_with(cod_frames:prolog_frame, Frame)),
              step(read_body_memfile_before, read_one_frame_before(Frame)),
              step(json_to_dict_library_before, atom_json_dict(Body, _, [value_string_as(string), tag('')])),
              step(json_to_dict_fast, cod_fastjson:fast_json_dict(BodyS, _)),
              step(whole_read_and_parse, read_and_parse(Frame)),
              step(direct_query_whole, cod_server:direct_query(prof, "bench_fact(X)", Opts, _)),
              step(with_app_slot_true, with_app_slot(prof, client(daemon, true), true)),
              step(run_query_whole, run_query(prof, "bench_fact(X)", Opts, _)),
              step(query_goal_parse_check, cod_apps:query_goal(app_prof, "bench_fact(X)", _, _)),
              step(query_goal_not_cached, ( nb_delete(cod_last_goal), cod_apps:query_goal(app_prof, "bench_fact(X)", _, _) )),
              step(parse_terms, cod_apps:parse_terms(app_prof, "bench_fact(X)", _, [])),
              step(variant_sha1, variant_sha1(bench_fact(_), _)),
              step(snapshot_true, snapshot(true)),
              step(run_limited_true, run_limited(true, 5, 10000000)),
              step(limited_findnsols, cod_apps:limited(prof, cod_apps:findnsols_first(10001, v(X), app_prof:bench_fact(X), _), 5, 10000000)),
              step(reply_text_and_send, ( cod_direct:result_text(1, answer(answer(Sols, false, 3)), T, _),
                                          cod_direct:send_text(Null, T) )),
              step(result_text, cod_direct:result_text(1, answer(answer(Sols, false, 3)), _, _)),
              step(answer_size_within, cod_json:answer_size_within(Sols, 1048576)),
              step(send_text, cod_direct:send_text(Null, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"solutions\":[{\"X\":42}]}}")),
              step(with_stack_grant_true, cod_grants:with_stack_grant([O]>>(O = false), true, [_]>>true)),
              step(frame_body_prolog_writer, frame_body_prolog(Null, reply_text(Sols))),
              step(frame_body_memfile_before, frame_body_before(Null, reply_text(Sols))),
              step(thread_self, thread_self(_)),
              step(get_time, get_time(_))
            ],
    (   getenv('COD_PROFILE_RSS', _)
    ->  forall(member(step(Name, Goal), Steps),
               ( rss_kb(R0), forall(between(1, N, _), once(Goal)), rss_kb(R1), D is R1 - R0,
                 format(user_error, "~w: +~w kB~n", [Name, D]) ))
    ;   true
    ),
    findall(Name-Us, ( member(step(Name, Goal), Steps), ( time_step(Goal, N, Us) -> true ; Us = failed ) ), Pairs),
    dict_pairs(D, _, Pairs),
    json_write_dict(current_output, D, [width(0)]), nl.

frame_text(Body, Len, Frame) :-
    B0 is (Len >> 24) /\ 0xff, B1 is (Len >> 16) /\ 0xff, B2 is (Len >> 8) /\ 0xff, B3 is Len /\ 0xff,
    atom_codes(Body, Cs),
    new_memory_file(Frame),
    setup_call_cleanup(open_memory_file(Frame, write, W, [encoding(octet)]),
                       maplist(put_byte(W), [B0, B1, B2, B3|Cs]), close(W)).

%   read_frame_with(:Reader, +Frame): the rest of the frame after its first
%   byte, read and parsed by Reader (cod_frames.pl's C or Prolog reader).
read_frame_with(Reader, Frame) :-
    setup_call_cleanup(open_memory_file(Frame, read, In, [encoding(octet)]),
                       ( get_byte(In, B0), call(Reader, In, B0, 1048576, json(_)) ),
                       close(In)).

frame_body_prolog(Out, Writer) :-
    with_output_to(string(Text), Writer),
    cod_frames:prolog_write_frame(Out, Text, 1048576).

open_only(Frame) :-
    setup_call_cleanup(open_memory_file(Frame, read, In, [encoding(octet)]), true, close(In)).

read_and_parse(Frame) :-
    setup_call_cleanup(open_memory_file(Frame, read, In, [encoding(octet)]),
                       ( get_byte(In, B0),
                         cod_direct:read_frame(In, B0, request(_, _, _)) ),
                       close(In)).

time_step(Goal, N, Us) :-
    findall(U, ( between(1, 7, _), round_us(Goal, N, U) ), Us7),
    min_list(Us7, Us).

round_us(Goal, N, Us) :-
    statistics(cputime, T0),
    forall(between(1, N, _), once(Goal)),
    statistics(cputime, T1),
    Us is round((T1 - T0) / N * 1e7) / 10.

%   The implementations before issue 31, to compare in the same run.
read_one_frame_before(Frame) :-
    setup_call_cleanup(open_memory_file(Frame, read, In, [encoding(octet)]),
                       ( get_byte(In, B0), get_byte(In, B1), get_byte(In, B2), get_byte(In, B3),
                         Size is (B0 << 24) \/ (B1 << 16) \/ (B2 << 8) \/ B3,
                         read_body_before(In, Size, _) ),
                       close(In)).

read_body_before(In, Size, Body) :-
    setup_call_cleanup(
        new_memory_file(MF),
        ( setup_call_cleanup(
              stream_range_open(In, Range, [size(Size)]),
              setup_call_cleanup(
                  open_memory_file(MF, write, W, [encoding(octet)]),
                  copy_stream_data(Range, W),
                  close(W)),
              close(Range)),
          size_memory_file(MF, Got, octet),
          (   Got < Size
          ->  throw(cod_close)
          ;   memory_file_to_string(MF, Body, utf8)
          ) ),
        free_memory_file(MF)).

%   reply_text(+Sols): what result_text/4 makes for a query's answer.
reply_text(Sols) :-
    write('{"jsonrpc":"2.0","id":1,"result":{"solutions":['),
    cod_direct:write_solutions(Sols),
    write(']}}').

frame_body_before(Out, Writer) :-
    setup_call_cleanup(new_memory_file(MF), frame_memfile_before(Out, MF, Writer), free_memory_file(MF)).

frame_memfile_before(Out, MF, Writer) :-
    setup_call_cleanup(open_memory_file(MF, write, W, [encoding(utf8)]), with_output_to(W, Writer), close(W)),
    size_memory_file(MF, Size, octet),
    B0 is (Size >> 24) /\ 0xff, B1 is (Size >> 16) /\ 0xff, B2 is (Size >> 8) /\ 0xff, B3 is Size /\ 0xff,
    put_byte(Out, B0), put_byte(Out, B1), put_byte(Out, B2), put_byte(Out, B3),
    setup_call_cleanup(open_memory_file(MF, read, R, [encoding(octet)]), copy_stream_data(R, Out), close(R)),
    flush_output(Out).

rss_kb(KB) :-
    read_file_to_string('/proc/self/status', S, []),
    sub_string(S, B, _, _, "VmRSS:"), !,
    sub_string(S, B, 40, _, Line), split_string(Line, " \t\n", " \t\n", [_|Ws]),
    include([W]>>(W \== ""), Ws, [V|_]), number_string(KB, V).
