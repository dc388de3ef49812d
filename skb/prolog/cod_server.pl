/*  COD SKB server: a multi-threaded SWI-Prolog engine.

    Control channel (standard input/output, the Resource Manager only):
    one request per Prolog term on standard input, `req(Id, Operation).`,
    one JSON object per line on standard output, in any order:
        {"id":Id,"ok":Result}
        {"id":Id,"error":{"code":Code,"message":Text,"data":{...}}}
    The Python side (cod.skb.session) builds the requests.

    Direct channel (cod_direct.pl): a Unix socket on which clients holding
    a capability granted by the Resource Manager run queries themselves.
*/

:- module(cod_server, [main/0]).
% First: the deny layer must come before library(sandbox) (see cod_guard.pl).
:- use_module(cod_guard).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- use_module(library(option)).
:- use_module(library(readutil)).
:- use_module(cod_sys).
:- use_module(cod_apps).
:- use_module(cod_json).
:- use_module(cod_results).
:- use_module(cod_errors).
:- use_module(cod_limits).
:- use_module(cod_direct).
:- use_module(cod_pool).
:- use_module(cod_grants).

/** <module> The SKB server

Threads, and why:

  - main: reads the control channel and routes each request; never runs
    application code, so the Resource Manager's requests are always read.
  - cod_writer: every change (system facts, the allocation, application
    facts and procedures), one at a time, each in transaction/1: readers
    never see half a change, and a change that fails leaves nothing.
  - workers (cod_pool.pl: a pool that grows on demand up to max_threads,
    and shrinks back to min_workers when idle): queries and other reads.
    Each query runs in snapshot/1 under its own time, inference and stack
    limits; a runaway query costs its own thread only, and a worker that
    dies is counted out of the pool and its job answered.
  - direct channel: an acceptor and one thread per connection
    (cod_direct.pl), under the same limits and slots.

Fairness (cod_pool.pl): at most app_slots queries of one application and
uid_threads of one unprivileged uid run at once, on both channels
together, and unprivileged uids together leave reserved_privileged_threads
to root and the daemon; the others wait in one FIFO, so one application's
or one uid's slow queries never make another wait for a slot.  CPU time
between running queries is shared by the kernel.
*/

% Library files (stored_procedures/) load the schema as cod_skb(cod_sys).
:- multifile user:file_search_path/2.
:- prolog_load_context(directory, Dir),
   asserta(user:file_search_path(cod_skb, Dir)).

:- dynamic
    setting/2,             % Name, Value (from the command line)
    protocol_out/1.        % Stream: the control channel's output

%   default_setting(?Name, ?Default): the command line's settings (--name-with-dashes
%   Value) and their defaults: the server's own, and those of the pool, the
%   grants and the direct channel, each kept by its module.
default_setting(bulk_reply_chars, 65536).       % a reply longer than this is bulk ...
default_setting(bulk_replies_queued, 8).        % ... and at most this many bulk replies wait to be sent
default_setting(thread_stack, 268435456).       % bytes: the writer's and the control channel reader's stacks
default_setting(max_reply_bytes, 67108864).
default_setting(direct_socket, '').
default_setting(Name, Default) :- pool_default(Name, Default).
default_setting(Name, Default) :- grant_default(Name, Default).
default_setting(Name, Default) :- direct_default(Name, Default).

%!  main is det.
%
%   Serve requests until end of file on standard input.
main :-
    (   guard_installed
    ->  true
    ;   format(user_error, "COD SKB: the sandbox deny layer is not installed first; refusing to start~n", []),
        halt(2)
    ),
    current_prolog_flag(argv, Argv),
    read_settings(Argv),
    set_stream(user_input, encoding(utf8)),
    set_stream(user_output, encoding(utf8)),
    set_stream(user_output, buffer(full)),
    set_prolog_flag(toplevel_prompt, ''),
    stream_property(In, alias(user_input)),
    stream_property(Out, alias(user_output)),
    assertz(protocol_out(Out)),
    detach_standard_streams,
    % Applications see exactly what their namespace imports (cod_apps.pl):
    % nothing may be autoloaded on their behalf (listing/1, gensym/2 ...).
    autoload_all,
    set_prolog_flag(autoload, false),
    message_queue_create(_, [alias(cod_writer)]),
    start_grants,
    start_pool,
    setting(thread_stack, Stack),
    thread_create(writer_loop, _, [alias(cod_writer_thread), stack_limit(Stack)]),
    start_watchdog,
    start_direct,
    start_output(Out),
    send_line('{"ready":true}'),
    serve(In),
    flush_replies.

read_settings(Argv) :-
    forall(default_setting(Name, Default),
           (   atom_concat('--', Name, Flag0),
               atomic_list_concat(Parts, '_', Flag0),
               atomic_list_concat(Parts, '-', Flag),
               (   append(_, [Flag, Text|_], Argv)
               ->  (   atom_number(Text, Value) -> true ; Value = Text )
               ;   Value = Default
               ),
               assertz(setting(Name, Value))
           )).

start_grants :-
    settings_of(grant_default, Opts),
    grants_init(Opts).

start_pool :-
    settings_of(pool_default, Opts),
    pool_init([run(cod_server:pooled_op), died(cod_server:job_died)|Opts]).

start_direct :-
    setting(direct_socket, Path),
    (   Path == ''
    ->  true
    ;   settings_of(direct_default, Opts),
        direct_listen(Path, [run_query(cod_server:direct_query)|Opts])
    ).

%   settings_of(+Defaults, -Options): the settings a module's table of
%   Defaults names, as options (Name(Value)).
settings_of(Defaults, Options) :-
    findall(Opt, ( call(Defaults, Name, _),
                   setting(Name, Value),
                   Opt =.. [Name, Value] ), Options).

%!  detach_standard_streams is det.
%
%   Bind user_input, user_output and user_error (and the current streams)
%   of this thread and of every thread it creates to an empty input and a
%   null output.  Whatever application code reads or writes never reaches
%   the protocol channel or the daemon's log.
detach_standard_streams :-
    open_string("", NullIn),
    open_null_stream(NullOut),
    set_stream(NullIn, alias(user_input)),
    set_stream(NullOut, alias(user_output)),
    set_stream(NullOut, alias(user_error)),
    set_input(NullIn),
    set_output(NullOut).

serve(In) :-
    repeat,
        catch(read_term(In, Request, []), E,
              ( reply_error(0, E), fail )),
        (   Request == end_of_file
        ->  !
        ;   catch(route(Request), E2, reply_error(0, E2)),
            fail
        ).

route(req(Id, Op)) :-
    integer(Id), !,
    (   op_kind(Op, Kind)
    ->  dispatch(Kind, Id, Op)
    ;   reply_error(Id, error(domain_error(skb_operation, Op), _))
    ).
route(Other) :-
    reply_error(0, error(domain_error(request, Other), _)).

dispatch(inline, Id, Op) :-
    run_op(Id, Op).
dispatch(write, Id, Op) :-
    thread_send_message(cod_writer, job(Id, Op)).
dispatch(read, Id, Op) :-
    submit(job(Id, Op, none, none)).
dispatch(query(App), Id, Op) :-
    (   atom(App), valid_app_name(App)
    ->  (   catch(op_client(Op, Client), E, true)
        ->  (   var(E)
            ->  request_slot(App, Client, job(Id, Op, App, Client))
            ;   reply_error(Id, E)
            )
        ;   reply_error(Id, error(domain_error(cod_client, Op), _))
        )
    ;   reply_error(Id, error(domain_error(cod_app_name, App), _))
    ).

%   op_client(+Op, -Client): whom a query runs for, client(Uid, Privileged),
%   from its options uid(Uid) and privileged(Bool); a query that names no
%   uid is the Resource Manager's own (privileged).
op_client(query(_, _, Options), Client) :- !,
    options_client(Options, Client).
op_client(evaluate(_, _, _, Options), Client) :- !,
    options_client(Options, Client).
op_client(_, client(daemon, true)).

options_client(Options, Client) :-
    (   is_list(Options), memberchk(uid(Uid), Options)
    ->  must_be(nonneg, Uid),
        (   memberchk(privileged(P), Options) -> must_be(boolean, P) ; P = false ),
        Client = client(Uid, P)
    ;   Client = client(daemon, true)
    ).

%   op_kind(+Operation, -Kind): who runs it.
op_kind(ping, inline).
op_kind(stats, inline).
op_kind(cancel(_), inline).
op_kind(abandon(_), inline).
op_kind(load_system(_), write).
op_kind(add_system_facts(_), write).
op_kind(remove_system_facts(_), write).
op_kind(replace_system_facts(_, _), write).
op_kind(replace_many(_), write).
op_kind(add_facts(_, _, _, _), write).
op_kind(remove_facts(_, _), write).
op_kind(add_procedure(_, _, _, _), write).
op_kind(drop_owner(_, _), write).
op_kind(release_app(_), write).
op_kind(drop_app(_), write).
op_kind(load_library(_), write).
op_kind(snapshot, write).
op_kind(restore_system(_), write).
op_kind(restore_app(_, _), write).
op_kind(grant(_, _), write).
op_kind(grant(_, _, _), write).
op_kind(batch(_), write).
op_kind(revoke(_), write).
op_kind(list_facts(_, _), read).
op_kind(list_procedures(_), read).
op_kind(usage(_), read).
op_kind(describe_app(_), read).
op_kind(predicates(_, _), read).
op_kind(query(App, _, _), query(App)).
op_kind(evaluate(App, _, _, _), query(App)).
op_kind(time_query(App, _, _), query(App)).

		 /*******************************
		 *      THE WRITER THREAD       *
		 *******************************/

writer_loop :-
    thread_get_message(cod_writer, job(Id, Op)),
    once(op_outcome(Op, Outcome)),  % (once/1: see worker_loop/0)
    once(after_write(Op)),          % before the reply: who reads next sees the module gone
    once(send_outcome(Id, Outcome)),
    writer_loop.

%   after_write(+Op): work that may not happen inside a transaction.
after_write(release_app(App)) :- !,
    collect_app(App).
after_write(drop_app(App)) :- !,
    collect_app(App).
after_write(_).

%   collect_app(+App): free the module of an application that holds
%   nothing, unless one of its queries still runs.
collect_app(App) :-
    with_mutex(cod_slots,
               (   empty_app(App, M),
                   \+ app_busy(App)
               ->  destroy_app(App, M)
               ;   true
               )).

		 /*******************************
		 *          OPERATIONS          *
		 *******************************/

%   run_op(+Id, +Op): run and reply (the control channel's inline operations).
run_op(Id, Op) :-
    op_outcome(Op, Outcome),
    send_outcome(Id, Outcome).

%   pooled_op(+Id, +Op): a worker's job, run and answered under the worker's
%   small stacks, or run again under a large grant if it outgrew them
%   (cod_grants.pl): reads and queries only, which may run twice.
:- public pooled_op/2.
pooled_op(Id, Op) :-
    with_stack_grant(op_line(Id, Op, Line), send_line(Line), reply_error(Id)).

op_line(Id, Op, Line, Outgrew) :-
    op_outcome(Op, Outcome),
    outcome_line(Id, Outcome, Line, Outgrew).

%   job_died(+Id, +Status): the worker running request Id ended before
%   answering it (cod_pool.pl); its caller gets an error now.
:- public job_died/2.
job_died(Id, _Status) :-
    reply_error(Id, error(resource_error(cod_query_worker), _)).

%   op_outcome(+Op, -Outcome): ok(Result) or error(E).
op_outcome(Op, Outcome) :-
    op_kind(Op, Kind),
    op_tag(Op, Tag),
    nb_setval(cod_tag, Tag),
    (   abandoned(Tag)      % its client is gone: nobody would read the answer
    ->  Runner = throw(cod_limit(cancelled))
    ;   Kind == write, Op \== snapshot
    ->  Runner = with_declarations(transaction(op_result(Op, Result)))
    ;   Runner = op_result(Op, Result)
    ),
    (   catch(Runner, E, true)
    ->  (   var(E)
        ->  Outcome = ok(Result)
        ;   Outcome = error(E)
        )
    ;   Outcome = error(error(failed(Op), _))
    ).

send_outcome(Id, ok(Result)) :-
    reply_ok(Id, Result).
send_outcome(Id, error(E)) :-
    reply_error(Id, E).

%   op_tag(+Op, -Tag): whom a query runs for (the client's capability
%   token, so that cancel/1 can stop it), or none.
op_tag(query(_, _, Options), Tag) :-
    is_list(Options),
    memberchk(tag(Tag0), Options),
    atom(Tag0), !,
    Tag = Tag0.
op_tag(evaluate(_, _, _, Options), Tag) :-
    is_list(Options),
    memberchk(tag(Tag0), Options),
    atom(Tag0), !,
    Tag = Tag0.
op_tag(_, none).

%!  op_result(+Operation, -Result) is det.
op_result(ping, atom(pong)) :-
    % pong only while the query pool serves (cod_pool.pl): an engine whose
    % pool stopped is restarted by the Resource Manager as a dead one is.
    pool_health(Health),
    (   Health == ok
    ->  true
    ;   throw(error(resource_error(cod_query_pool), context(ping, Health)))
    ).
op_result(stats, json([app_slots-S, apps-A, app_modules-AM, atoms-At,
                        stacks_all_threads-St|Pool])) :-
    % SWI-Prolog 9.0 reports stack use for all threads together, also from
    % thread_statistics/3: there is no per-thread figure to give.
    statistics(stack, St),
    pool_stats(Pool0),
    grant_stats(Grants),
    append(Pool0, Grants, Pool),
    setting(app_slots, S),
    aggregate_all(count, existing_app_module(_, _), A),
    aggregate_all(count, ( current_module(Mod), sub_atom(Mod, 0, _, _, app_) ), AM),
    statistics(atoms, At).
op_result(load_system(Text), int(N)) :-
    % Parse and check everything before the old facts go: a text that does
    % not read leaves the machine as it was (and the transaction around
    % every write undoes a failure half-way anyway).
    parse_terms(cod_sys, Text, Terms, []),
    maplist(hardware_fact, Terms, Facts),
    forall(cod_sys_hardware_predicate(Name, Arity),
           ( functor(H, Name, Arity), retractall(cod_sys:H) )),
    maplist(cod_sys_assert, Facts),
    length(Facts, N).
op_result(add_system_facts(Texts), int(N)) :-
    must_be(list, Texts),
    maplist(parse_single(cod_sys), Texts, Facts),
    maplist(check_system_fact, Facts),
    maplist(cod_sys_assert, Facts),
    length(Facts, N).
op_result(remove_system_facts(Text), int(N)) :-
    parse_single(cod_sys, Text, Pattern),
    cod_sys_retract(Pattern, N).
op_result(replace_system_facts(PatternText, Texts), int(N)) :-
    replace_one(PatternText-Texts, 0, N).
op_result(replace_many(Pairs), int(N)) :-
    must_be(list, Pairs),
    foldl(replace_one, Pairs, 0, N).
op_result(add_facts(App, Owner0, Texts, Limits), json([added-N, usage-U])) :-
    owner(Owner0, Owner),
    add_facts(App, Owner, Texts, Limits, N),
    usage_json(App, U).
op_result(remove_facts(App, Patterns), json([removed-N, usage-U])) :-
    remove_facts(App, Patterns, N),
    usage_json(App, U).
op_result(add_procedure(App, Text, Persistent, Limits), json([predicates-Strs, usage-U])) :-
    add_procedure(App, Text, Persistent, Limits, PIs),
    maplist(pi_string, PIs, Strs),
    usage_json(App, U).
op_result(drop_owner(App, Owner0), json([removed-N, usage-U])) :-
    owner(Owner0, Owner),
    drop_owner(App, Owner, N),
    usage_json(App, U).
op_result(release_app(App), json([usage-U])) :-
    release_app(App),
    usage_json(App, U).
op_result(drop_app(App), atom(ok)) :-
    drop_app(App).
op_result(list_facts(App, Pred), strings(Texts)) :-
    list_facts(App, Pred, Texts).
op_result(list_procedures(App), strings(Texts)) :-
    list_procedures(App, Texts).
op_result(usage(App), json(U)) :-
    usage_pairs(App, U).
op_result(query(App, Text, Options), Answer) :-
    option_limits(Options, Options1),
    run_query(App, Text, Options1, Answer).
op_result(abandon(Tag), int(N)) :-
    must_be(atom, Tag),
    abandon_tagged(Tag, N).
op_result(cancel(Tag), int(N)) :-
    must_be(atom, Tag),
    cancel_tagged(Tag, N).
op_result(describe_app(App), json([procedures-objects(Procs), facts-objects(Facts)])) :-
    describe_app(App, Procs0, Facts0),
    maplist(procedure_json, Procs0, Procs),
    maplist(fact_count_json, Facts0, Facts).
op_result(predicates(App, Kind), json([predicates-objects(Rows)])) :-
    must_be(oneof([system, library, app, all]), Kind),
    findall(json([name-N, arity-A, kind-K]), visible_predicate(App, Kind, N, A, K), Rows0),
    sort(Rows0, Rows).
op_result(evaluate(App, Staged0, Queries, Options), results(Results)) :-
    maplist(staged_change, Staged0, Staged),
    option_limits(Options, Options1),
    evaluate(App, Staged, Queries, Options1, Results).
op_result(load_library(File), strings(Strs)) :-
    load_library_file(File, Module),
    module_property(Module, exports(PIs)),
    maplist(pi_string, PIs, Strs).
op_result(snapshot, snapshot(System, Apps)) :-
    % The whole state, as text that the restore operations read back:
    % used to compact the Python side's replay journal.
    findall(T, ( cod_sys_predicate(Name, Arity),
                 functor(H, Name, Arity),
                 clause(cod_sys:H, true),
                 format(string(T), '~k', [H]) ),
            System),
    findall(App-State, app_snapshot(App, State), Apps).
op_result(restore_system(Texts), int(N)) :-
    maplist(parse_single(cod_sys), Texts, Facts),
    maplist(check_system_fact, Facts),
    forall(cod_sys_predicate(Name, Arity),
           ( functor(H, Name, Arity), retractall(cod_sys:H) )),
    maplist(cod_sys_assert, Facts),
    length(Facts, N).
op_result(restore_app(App, State0), atom(ok)) :-
    restore_state(State0, State),
    restore_app(App, State).
op_result(batch(Ops), list(Results)) :-
    % Several writes as one: the transaction around every write makes them
    % all or nothing, and no reader sees some done and others not.
    must_be(list, Ops),
    forall(member(Op, Ops),
           (   op_kind(Op, write), Op \= batch(_), Op \== snapshot
           ->  true
           ;   domain_error(batchable_write, Op)
           )),
    maplist(op_result, Ops, Results).
op_result(grant(Token, App), atom(ok)) :-
    grant_token(Token, App).
op_result(grant(Token, App, Client), atom(ok)) :-
    grant_token(Token, App, Client).
op_result(revoke(Token), atom(ok)) :-
    revoke_token(Token).
op_result(time_query(App, Text, Times), times(Us, CpuPerCall)) :-
    % Runs a query Times times inside the engine and reports the wall time
    % of each limited call, and the engine's CPU time per whole query
    % operation (parsing, safety check, limits, query), averaged over the
    % run because the CPU clock is coarse.  For bench/.
    statistics(cputime, C0),
    length(Us, Times),
    maplist(time_once(App, Text), Us),
    statistics(cputime, C1),
    CpuPerCall is (C1 - C0) * 1000000 / Times.

time_once(App, Text, Us) :-
    run_query(App, Text, [all(false)], answer(_, _, Us)).

%   The engine keeps its own ceilings on what a caller may ask for.
option_limits(Options, Options) :-
    must_be(list, Options),
    (   memberchk(time_limit(T), Options)
    ->  (   number(T), T > 0, T < inf
        ->  true
        ;   domain_error(finite_time_limit, T)
        )
    ;   true
    ).

owner(persistent, persistent) :- !.
owner(conn(Id), conn(Id)) :- integer(Id), !.
owner(Id, conn(Id)) :- integer(Id), !.
owner(Other, _) :- domain_error(fact_owner, Other).

staged_change(facts(Owner0, Texts, Limits), facts(Owner, Texts, Limits)) :- !,
    owner(Owner0, Owner).
staged_change(C, C).

restore_state(state(Facts0, Procs, Declared), state(Facts, Procs, Declared)) :-
    maplist(restore_fact_owners, Facts0, Facts).

restore_fact_owners(Text-Owners0, Text-Owners) :-
    maplist(owner, Owners0, Owners).

usage_pairs(App, [facts-F, fact_chars-FC, clauses-C, clause_chars-CC]) :-
    app_usage(App, usage(F, FC, C, CC)).

usage_json(App, json(U)) :-
    usage_pairs(App, U).

replace_one(PatternText-Texts, N0, N) :-
    parse_single(cod_sys, PatternText, Pattern),
    must_be(list, Texts),
    maplist(parse_single(cod_sys), Texts, Facts),
    maplist(check_system_fact, Facts),
    cod_sys_retract(Pattern, _),
    maplist(cod_sys_assert, Facts),
    length(Facts, K),
    N is N0 + K.

procedure_json(proc(PI, Clauses, Persistent), json([predicate-S, clauses-Clauses, persistent-bool(Persistent)])) :-
    pi_string(PI, S).

fact_count_json(PI-Count, json([predicate-S, count-Count])) :-
    pi_string(PI, S).

%   visible_predicate(+App, +Kind, -Name, -Arity, -Kind): what App's code may
%   call, by kind (system, library, app or all).
visible_predicate(_, Kind, Name, Arity, system) :-
    memberchk(Kind, [system, all]),
    module_property(cod_sys, exports(PIs)),
    member(Name/Arity, PIs),
    \+ sub_atom(Name, 0, _, _, cod_sys_).
visible_predicate(_, Kind, Name, Arity, library) :-
    memberchk(Kind, [library, all]),
    library_module(M),
    module_property(M, exports(PIs)),
    member(Name/Arity, PIs).
visible_predicate(App, Kind, Name, Arity, app) :-
    memberchk(Kind, [app, all]),
    describe_app(App, Procs, Facts),
    (   member(proc(Name/Arity, _, _), Procs)
    ;   member((Name/Arity)-_, Facts)
    ).

pi_string(Name/Arity, S) :-
    format(string(S), '~q/~w', [Name, Arity]).

parse_single(M, Text, Term) :-
    parse_terms(M, Text, Terms, []),
    (   Terms = [Term-_]
    ->  true
    ;   domain_error(single_term, Text)
    ).

hardware_fact(Fact-_, Fact) :-
    check_system_fact(Fact),
    functor(Fact, Name, Arity),
    (   cod_sys_hardware_predicate(Name, Arity)
    ->  true
    ;   domain_error(cod_hardware_fact, Name/Arity)
    ).

check_system_fact(Fact) :-
    must_be(callable, Fact),
    (   Fact = (_:-_)
    ->  domain_error(fact, Fact)
    ;   true
    ).

load_library_file(File, Module) :-
    must_be(text, File),
    atom_string(FileA, File),
    % Trusted library code may rely on autoloading: resolve it all now,
    % while loading, since nothing is autoloaded once queries run.
    setup_call_cleanup(
        set_prolog_flag(autoload, true),
        ( load_files(FileA, [must_be_module(true), redefine_module(false)]),
          autoload_all ),
        set_prolog_flag(autoload, false)),
    module_property(Module, file(Path)),
    same_file(Path, FileA),
    !,
    register_library(Module).

		 /*******************************
		 *        DIRECT QUERIES        *
		 *******************************/

%   direct_query(+App, +Goal, +Options, -Answer): a query of a direct
%   connection, under App's slots and the same limits as the control
%   channel's queries.
:- public direct_query/4.
direct_query(App, Goal, Options, Answer) :-
    option_limits(Options, Options1),
    options_client(Options1, Client),
    with_app_slot(App, Client, run_query(App, Goal, Options1, Answer)).

		 /*******************************
		 *           REPLIES            *
		 *******************************/

reply_ok(Id, Result) :-
    ok_line(Id, Result, Line, _),
    send_line(Line).

%   outcome_line(+Id, +Outcome, -Line, -Outgrew): the reply to request Id;
%   Outgrew is true when making the result or its text ran out of stack
%   (the caller may make it again with more: cod_grants.pl).
outcome_line(Id, ok(Result), Line, Outgrew) :-
    ok_line(Id, Result, Line, Outgrew).
outcome_line(Id, error(E), Line, Outgrew) :-
    failure_line(Id, E, Line, Outgrew).

ok_line(Id, Result, Line, Outgrew) :-
    (   Result = answer(Solutions, _, _)
    ->  setting(max_reply_bytes, Max),
        catch(answer_size_within(Solutions, Max), TooBig, true)
    ;   true
    ),
    (   nonvar(TooBig)
    ->  failure_line(Id, TooBig, Line, Outgrew)
    ;   written_line(Id, Result, Line, Outgrew)
    ).

written_line(Id, Result, Line, Outgrew) :-
    (   catch(with_output_to(string(Text),
                             ( format('{"id":~w,"ok":', [Id]),
                               write_result(current_output, Result),
                               write('}') )),
              E, true)
    ->  (   var(E)
        ->  Outgrew = false,
            (   Result = snapshot(_, _)     % trusted, read by the journal alone
            ->  Line = Text
            ;   checked_line(Id, Text, Line)
            )
        ;   failure_line(Id, E, Line, Outgrew)
        )
    ;   failure_line(Id, error(failed(reply), _), Line, Outgrew)
    ).

%   checked_line(+Id, +Text, -Line): a reply over the size limit is an
%   error for its own caller only (nothing of it is sent).
checked_line(Id, Text, Line) :-
    string_length(Text, Len),
    setting(max_reply_bytes, Max),
    (   Len > Max
    ->  error_line(Id, error(resource_error(cod_reply(Len, Max)), _), Line)
    ;   Line = Text
    ).

failure_line(Id, E, Line, Outgrew) :-
    outgrown(E, Outgrew),
    error_line(Id, E, Line).

%   Replies leave through one thread (cod_output), in two classes: a bulk
%   reply (more than bulk_reply_chars) waits until fewer than
%   bulk_replies_queued others wait to be written (back-pressure: a worker
%   that made a large answer holds it until the Resource Manager reads,
%   so what waits to be sent is bounded), and every other reply (pings,
%   writes, errors, small answers) is written before any bulk reply
%   queued: a pong never waits behind hundreds of large answers (it did,
%   for over 30 s, and the engine was restarted as dead; issue 23).
start_output(Out) :-
    setting(bulk_replies_queued, N),
    message_queue_create(_, [alias(cod_replies)]),
    message_queue_create(_, [alias(cod_bulk_slots), max_size(N)]),
    thread_create(output_loop(Out), _, [alias(cod_output)]).

send_line(Line) :-
    string_length(Line, Len),
    setting(bulk_reply_chars, Bulk),
    (   Len > Bulk
    ->  thread_send_message(cod_bulk_slots, slot),
        Msg = bulk(Line)
    ;   Msg = small(Line)
    ),
    flag(cod_replies_unsent, N, N+1),
    thread_send_message(cod_replies, Msg).

output_loop(Out) :-
    (   thread_get_message(cod_replies, small(Line), [timeout(0)])
    ->  Kind = small
    ;   thread_get_message(cod_replies, Msg),
        Msg =.. [Kind, Line]
    ),
    catch(( write(Out, Line), nl(Out), flush_output(Out) ), _, true),
    flag(cod_replies_unsent, N, N-1),
    (   Kind == bulk -> thread_get_message(cod_bulk_slots, slot) ; true ),
    output_loop(Out).

%   flush_replies: at the end of input, let the replies already made go
%   out (for at most two seconds) before the engine halts.
flush_replies :-
    (   between(1, 200, _),
        (   flag(cod_replies_unsent, 0, 0) -> true ; sleep(0.01), fail )
    ->  true
    ;   true
    ).

reply_error(Id, E) :-
    error_line(Id, E, Line),
    send_line(Line).

error_line(Id, E, Line) :-
    (   catch(with_output_to(string(Line),
                             ( format('{"id":~w,"error":', [Id]),
                               write_error_object(current_output, E),
                               write('}') )),
              _, fail)
    ->  true
    ;   format(string(Line),
               '{"id":~w,"error":{"code":"engine","message":"the error could not be reported","data":{}}}',
               [Id])
    ).
