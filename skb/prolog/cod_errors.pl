/*  COD SKB: errors as the stable codes, sentences and data clients read.
*/

:- module(cod_errors,
          [ error_code/2,            % +Error, -Code
            error_message/2,         % +Error, -Message
            error_data/2             % +Error, -Pairs
          ]).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(cod_guard).

/** <module> Error reports of the COD SKB

One place turns an exception of the engine into what both channels (the
Resource Manager's pipe and the direct query socket) send: a stable code
(docs/skb-schema.md, "Errors"), one readable sentence, and
machine-readable data (the predicate refused, the line and column of a
syntax error, the index of a fact in a batch, the limit that was hit).
*/

%   error_code(+Error, -Code): the stable code clients switch on.
error_code(cod_limit(time), timeout) :- !.
error_code(cod_limit(cancelled), cancelled) :- !.
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
formal_code(resource_error(cod_quota(_, _)), quota) :- !.
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
formal_datum(resource_error(cod_quota(What, _)), quota, What).
formal_datum(resource_error(cod_quota(_, Max)), limit, Max).
formal_datum(resource_error(R), resource, S) :-
    R \= cod_quota(_, _),
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
message_text(cod_limit(cancelled), "query cancelled by its client") :- !.
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
message_text(error(resource_error(cod_quota(What, Max)), usage(What, Value)), M) :- !,
    quota_what(What, Text),
    format(string(M), 'quota exceeded: this would hold ~D ~w, the limit is ~D', [Value, Text, Max]).
message_text(error(resource_error(cod_reply(Bytes, Max)), _), M) :- !,
    format(string(M), 'answer too large: ~D bytes, the limit is ~D (ask for fewer solutions or smaller terms)', [Bytes, Max]).
message_text(error(representation_error(cod_answer_depth), max_depth(D)), M) :- !,
    format(string(M), 'answer too deeply nested to send: more than ~D levels', [D]).
message_text(error(representation_error(cod_integer_size), digits(D)), M) :- !,
    format(string(M), 'answer holds an integer too large to send: more than ~D digits', [D]).
message_text(error(domain_error(finite_time_limit, T), _), M) :- !,
    format(string(M), 'the time limit must be a finite positive number of seconds, not ~w', [T]).
message_text(error(permission_error(modify, procedure, PI), _), M) :- !,
    format(string(M), '~q is a procedure of this application: facts cannot be added to it', [PI]).
message_text(error(permission_error(modify, fact_predicate, PI), _), M) :- !,
    format(string(M), '~q holds facts of this application: a procedure cannot redefine it (remove the facts first)', [PI]).
message_text(error(permission_error(access, cod_token, _), _), M) :- !,
    M = "this capability is not valid (its connection to the Resource Manager has ended, or it was never issued)".
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
    format(string(M), 'invalid application name ~q: 1 to 128 bytes of printable UTF-8, no control characters', [App]).
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

quota_what(facts, facts).
quota_what(fact_chars, 'characters of facts').
quota_what(clauses, 'clauses of procedures').
quota_what(clause_chars, 'characters of procedures').
