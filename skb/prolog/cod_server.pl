/*  COD SKB server: the engine's side of the pipe protocol.

    One request per Prolog term on standard input, `req(Id, Operation).`,
    one JSON object per line on standard output:
        {"id":Id,"ok":Result}
        {"id":Id,"error":{"code":Code,"message":Text,"data":{...}}}
    The Python side (cod.skb.engine) builds the requests; see
    docs/design.md for why the SKB is a child process.
*/

:- module(cod_server, [main/0]).
% First: the deny layer must come before library(sandbox) (see cod_guard.pl).
:- use_module(cod_guard).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- use_module(library(readutil)).
:- use_module(cod_sys).
:- use_module(cod_apps).
:- use_module(cod_json).

% Library files (stored_procedures/) load the schema as cod_skb(cod_sys).
:- multifile user:file_search_path/2.
:- prolog_load_context(directory, Dir),
   asserta(user:file_search_path(cod_skb, Dir)).

%!  main is det.
%
%   Serve requests until end of file on standard input.
main :-
    (   guard_installed
    ->  true
    ;   format(user_error, "COD SKB: the sandbox deny layer is not installed first; refusing to start~n", []),
        halt(2)
    ),
    set_stream(user_input, encoding(utf8)),
    set_stream(user_output, encoding(utf8)),
    set_stream(user_output, buffer(full)),
    set_prolog_flag(toplevel_prompt, ''),
    detach_standard_streams(In, Out),
    % Applications see exactly what their namespace imports (cod_apps.pl):
    % nothing may be autoloaded on their behalf (listing/1, gensym/2 ...).
    autoload_all,
    set_prolog_flag(autoload, false),
    write(Out, '{"ready":true}\n'),
    flush_output(Out),
    serve(In, Out).

serve(In, Out) :-
    repeat,
        catch(read_term(In, Request, []), E,
              ( reply_error(Out, 0, E), fail )),
        (   Request == end_of_file
        ->  !
        ;   handle(Out, Request),
            fail
        ).

handle(Out, req(Id, Op)) :- !,
    (   catch(op_result(Op, Result), E, true)
    ->  (   var(E)
        ->  reply_ok(Out, Id, Result)
        ;   reply_error(Out, Id, E)
        )
    ;   reply_error(Out, Id, error(failed(Op), _))
    ).
handle(Out, Other) :-
    reply_error(Out, 0, error(domain_error(request, Other), _)).

		 /*******************************
		 *          OPERATIONS          *
		 *******************************/

%!  op_result(+Operation, -Result) is det.
op_result(ping, atom(pong)).
op_result(load_system(Text), int(N)) :-
    forall(cod_sys_hardware_predicate(Name, Arity),
           ( functor(H, Name, Arity), retractall(cod_sys:H) )),
    parse_terms(cod_sys, Text, Terms, []),
    foldl(assert_system, Terms, 0, N).
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
    parse_single(cod_sys, PatternText, Pattern),
    maplist(parse_single(cod_sys), Texts, Facts),
    maplist(check_system_fact, Facts),
    cod_sys_retract(Pattern, _),
    maplist(cod_sys_assert, Facts),
    length(Facts, N).
op_result(add_facts(App, Texts), int(N)) :-
    add_facts(App, Texts, N).
op_result(remove_facts(App, Text), int(N)) :-
    remove_facts(App, Text, N).
op_result(add_procedure(App, Text), strings(Strs)) :-
    add_procedure(App, Text, PIs),
    maplist(pi_string, PIs, Strs).
op_result(list_facts(App, Pred), strings(Texts)) :-
    list_facts(App, Pred, Texts).
op_result(drop_app(App), atom(ok)) :-
    drop_app(App).
op_result(query(App, Text, Options), Answer) :-
    run_query(App, Text, Options, Answer).
op_result(load_library(File), strings(Strs)) :-
    load_library_file(File, Module),
    module_property(Module, exports(PIs)),
    maplist(pi_string, PIs, Strs).
op_result(snapshot, snapshot(System, Apps)) :-
    % The whole state, as text that the restore operations below and
    % add_procedure/2 read back: used to compact the Python-side journal.
    findall(T, ( cod_sys_predicate(Name, Arity),
                 functor(H, Name, Arity),
                 clause(cod_sys:H, true),
                 format(string(T), '~k', [H]) ),
            System),
    findall(App-Texts,
            ( app(App, _),
              list_facts(App, all, Texts),
              Texts \== [] ),
            Apps).
op_result(restore_system(Texts), int(N)) :-
    maplist(parse_single(cod_sys), Texts, Facts),
    maplist(check_system_fact, Facts),
    forall(cod_sys_predicate(Name, Arity),
           ( functor(H, Name, Arity), retractall(cod_sys:H) )),
    maplist(cod_sys_assert, Facts),
    length(Facts, N).
op_result(time_query(App, Text, Times), times(Us, CpuPerCall)) :-
    % Runs a query Times times inside the engine and reports the wall time
    % of each limited call, and the engine's CPU time per whole query
    % operation (parsing, safety check, limits, query), averaged over the
    % run because the CPU clock is coarse.  CPU time is not inflated when
    % the VM runs something else.  For bench/.
    statistics(cputime, C0),
    length(Us, Times),
    maplist(time_once(App, Text), Us),
    statistics(cputime, C1),
    CpuPerCall is (C1 - C0) * 1000000 / Times.

time_once(App, Text, Us) :-
    run_query(App, Text, [all(false)], answer(_, _, Us)).

pi_string(Name/Arity, S) :-
    format(string(S), '~q/~w', [Name, Arity]).

parse_single(M, Text, Term) :-
    parse_terms(M, Text, Terms, []),
    (   Terms = [Term-_]
    ->  true
    ;   domain_error(single_term, Text)
    ).

assert_system(Fact-_, N0, N) :-
    check_system_fact(Fact),
    functor(Fact, Name, Arity),
    (   cod_sys_hardware_predicate(Name, Arity)
    ->  true
    ;   domain_error(cod_hardware_fact, Name/Arity)
    ),
    cod_sys_assert(Fact),
    N is N0 + 1.

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
		 *           REPLIES            *
		 *******************************/

reply_ok(Out, Id, Result) :-
    format(Out, '{"id":~w,"ok":', [Id]),
    write_result(Out, Result),
    write(Out, '}\n'),
    flush_output(Out).

write_result(Out, int(N)) :- write(Out, N).
write_result(Out, atom(A)) :- json_write_text(Out, A).
write_result(Out, strings(L)) :- json_write_value(Out, L).
write_result(Out, times(L, Cpu)) :-
    write(Out, '{"wall_us":'),
    json_write_value(Out, L),
    format(Out, ',"cpu_us_per_call":~4f}', [Cpu]).
write_result(Out, snapshot(System, Apps)) :-
    write(Out, '{"system":'),
    json_write_value(Out, System),
    write(Out, ',"apps":{'),
    write_app_pairs(Apps, Out),
    write(Out, '}}').
write_result(Out, answer(Solutions, Truncated, Us)) :-
    write(Out, '{"solutions":['),
    write_solutions(Solutions, Out),
    format(Out, '],"truncated":~w,"elapsed_us":~w}', [Truncated, Us]).

write_app_pairs([], _).
write_app_pairs([App-Texts|T], Out) :-
    json_write_text(Out, App),
    put_char(Out, ':'),
    json_write_value(Out, Texts),
    (   T == [] -> true ; put_char(Out, ','), write_app_pairs(T, Out) ).

write_solutions([], _).
write_solutions([S|T], Out) :-
    write_solution(Out, S),
    (   T == []
    ->  true
    ;   put_char(Out, ','),
        write_solutions(T, Out)
    ).

write_solution(Out, Pairs) :-
    put_char(Out, '{'),
    write_pairs(Pairs, Out),
    put_char(Out, '}').

write_pairs([], _).
write_pairs([K-V|T], Out) :-
    json_write_text(Out, K),
    put_char(Out, ':'),
    json_write_value(Out, V),
    (   T == []
    ->  true
    ;   put_char(Out, ','),
        write_pairs(T, Out)
    ).

reply_error(Out, Id, E) :-
    error_code(E, Code),
    error_message(E, Message),
    error_data(E, Data),
    format(Out, '{"id":~w,"error":{"code":', [Id]),
    json_write_text(Out, Code),
    write(Out, ',"message":'),
    json_write_text(Out, Message),
    write(Out, ',"data":{'),
    write_pairs(Data, Out),
    write(Out, '}}}\n'),
    flush_output(Out).

%   error_code(+Error, -Code): the stable code clients switch on.
error_code(cod_limit(time), timeout) :- !.
error_code(time_limit_exceeded, timeout) :- !.
error_code(time_limit_exceeded(_), timeout) :- !.
error_code(error(Formal, Ctx), Code) :-
    nonvar(Formal), nonvar(Ctx), formal_code(Formal, Code, Ctx), !.
error_code(error(Formal, _), Code) :- nonvar(Formal), formal_code(Formal, Code), !.
error_code(_, engine).

formal_code(syntax_error(_), syntax_error).
formal_code(permission_error(call, sandboxed, _), unsafe).
formal_code(permission_error(catch, reserved_exception, _), unsafe).
formal_code(permission_error(call, module_qualified, _), unsafe).
formal_code(permission_error(call, database_change, _), unsafe).
formal_code(permission_error(_, _, _), permission).
formal_code(resource_error(_), resource).
formal_code(existence_error(_, _), existence).
formal_code(type_error(_, _), type).
formal_code(domain_error(_, _), domain).
formal_code(instantiation_error, instantiation).
formal_code(uninstantiation_error(_), instantiation).
formal_code(representation_error(_), domain).
formal_code(evaluation_error(_), evaluation).
formal_code(failed(_), failed).

formal_code(instantiation_error, unsafe, sandbox(_, _)).

%   error_data(+Error, -Pairs): machine-readable details.
error_data(error(Formal, Context), Data) :-
    nonvar(Context), !,
    findall(K-V, ( error_datum(Formal, Context, K, V)
                 ; formal_datum(Formal, K, V) ), Data).
error_data(error(Formal, _), Data) :- !,
    findall(K-V, formal_datum(Formal, K, V), Data).
error_data(_, []).

formal_datum(permission_error(catch, reserved_exception, _), predicate, "catch/3") :- !.
formal_datum(permission_error(_, _, Culprit), predicate, S) :-
    culprit_pi(Culprit, S).
formal_datum(existence_error(procedure, Culprit), predicate, S) :-
    culprit_pi(Culprit, S).
formal_datum(resource_error(R), resource, S) :-
    format(string(S), '~w', [R]).

error_datum(syntax_error(_), Ctx, line, L) :- ctx_position(Ctx, L, _).
error_datum(syntax_error(_), Ctx, column, C) :- ctx_position(Ctx, _, C).
error_datum(_, fact(I, _), index, I) :- integer(I).
error_datum(_, inference_limit(N), inference_limit, N) :- integer(N).

ctx_position(text_position(L, C), L, C).
ctx_position(fact(_, Ctx), L, C) :- ctx_position(Ctx, L, C).

culprit_pi(V, "_") :- var(V), !.
culprit_pi(M:G, S) :- !,
    culprit_pi(G, S0),
    (   sub_atom(M, 0, _, _, app_) -> S = S0
    ;   format(string(S), '~q:~w', [M, S0])
    ).
culprit_pi(Name/Arity, S) :- !,
    format(string(S), '~q/~w', [Name, Arity]).
culprit_pi(G, S) :-
    callable(G), !,
    functor(G, Name, Arity),
    format(string(S), '~q/~w', [Name, Arity]).
culprit_pi(G, S) :-
    format(string(S), '~q', [G]).

%   error_message(+Error, -Message): one readable line.
error_message(E, Message) :-
    catch(message_text(E, Message), _, fail), !.
error_message(E, Message) :-
    format(string(Message), '~q', [E]).

message_text(cod_limit(time), "query exceeded its time limit") :- !.
message_text(time_limit_exceeded, "query exceeded its time limit") :- !.
message_text(error(permission_error(call, sandboxed, Name/Arity), cod_guard(_)), M) :- !,
    denied_reason(Name, Arity, Why),
    format(string(M), 'unsafe goal: calling ~q/~w is not allowed in the sandbox: ~s', [Name, Arity, Why]).
message_text(error(permission_error(catch, reserved_exception, C), cod_guard(PI)), M) :- !,
    (   var(C)
    ->  format(string(M), 'unsafe goal: ~w must name the exceptions it catches (its catcher is unbound, so it would catch the SKB\'s time and inference limits)', [PI])
    ;   format(string(M), 'unsafe goal: ~w may not catch ~q: the SKB\'s limits throw it', [PI, C])
    ).
message_text(error(domain_error(operator_fact, F), _), M) :- !,
    format(string(M), '~q is read as the operator term ~k, not as a fact: a fact\'s name is one word, such as db_rtime', [F, F]).
message_text(error(domain_error(ground_fact, F), _), M) :- !,
    format(string(M), 'a fact must be ground (no variables): ~k; a word starting with a capital letter or _ is a variable in Prolog, quote it (e.g. \'Zurich\')', [F]).
message_text(time_limit_exceeded(_), "query exceeded its time limit") :- !.
message_text(error(permission_error(call, sandboxed, G), Ctx), M) :- !,
    culprit_pi(G, PI),
    reached_from(Ctx, Via),
    format(string(M), 'unsafe goal: calling ~w is not allowed in the sandbox~w', [PI, Via]).
message_text(error(instantiation_error, sandbox(G, _)), M) :- !,
    format(string(M), 'unsafe goal: the sandbox cannot tell which predicate ~q calls (meta-calls must name their goal)', [G]).
message_text(error(permission_error(call, module_qualified, _), _), M) :- !,
    M = "unsafe goal: module-qualified goals are not allowed (an application sees only its own facts and the system predicates)".
message_text(error(permission_error(call, database_change, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), 'unsafe goal: ~w changes the database; use add_facts/remove_facts instead', [S]).
message_text(error(permission_error(modify, static_procedure, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), 'cannot redefine ~w: it is a built-in, system-level or library predicate', [S]).
message_text(error(permission_error(modify, module, Q), _), M) :- !,
    format(string(M), 'cannot write into another namespace: ~q', [Q]).
message_text(error(permission_error(execute, directive, D), _), M) :- !,
    format(string(M), 'directives are not allowed: ~q', [(:- D)]).
message_text(error(resource_error(inferences), inference_limit(N)), M) :- !,
    format(string(M), 'query exceeded its inference limit (~D inferences)', [N]).
message_text(error(resource_error(R), _), M) :- !,
    format(string(M), 'query ran out of resources: ~w (memory limit of the engine)', [R]).
message_text(error(syntax_error(What), Ctx), M) :-
    ctx_position(Ctx, L, C), !,
    syntax_what(What, W),
    format(string(M), 'syntax error at line ~w, column ~w: ~w', [L, C, W]).
message_text(error(syntax_error(What), _), M) :- !,
    syntax_what(What, W),
    format(string(M), 'syntax error: ~w', [W]).
message_text(error(existence_error(procedure, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), 'unknown procedure ~w', [S]).
message_text(error(domain_error(cod_app_name, App), _), M) :- !,
    format(string(M), 'invalid application name ~q: use [a-z][a-z0-9_]*, at most 64 characters', [App]).
message_text(error(domain_error(cod_system_fact, PI), _), M) :- !,
    format(string(M), '~w is not a system-level predicate of the SKB schema', [PI]).
message_text(error(failed(_), _), "operation failed") :- !.
message_text(E, M) :-
    message_to_string(E, M).

syntax_what(What, W) :-
    (   atom(What)
    ->  atomic_list_concat(Parts, '_', What),
        atomic_list_concat(Parts, ' ', W)
    ;   format(atom(W), '~w', [What])
    ).

message_to_string(Term, String) :-
    phrase('$messages':translate_message(Term), Lines),
    with_output_to(string(String0), print_message_lines(current_output, '', Lines)),
    split_string(String0, "\n", " \n", Parts0),
    exclude(==(""), Parts0, Parts),
    atomic_list_concat(Parts, ' ', A),
    atom_string(A, String).

reached_from(sandbox(_, Parents), Via) :-
    is_list(Parents), last(Parents, Top), !,
    culprit_pi(Top, PI),
    format(string(Via), ' (reached from ~w)', [PI]).
reached_from(_, "").
