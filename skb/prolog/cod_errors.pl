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
:- use_module(cod_text).

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
error_code(inference_limit_exceeded, resource) :- !.   % from a nested inference limit
error_code(error(Formal, Ctx), Code) :-
    nonvar(Formal), nonvar(Ctx), formal_code(Formal, Code, Ctx), !.
error_code(error(Formal, _), Code) :- nonvar(Formal), formal_code(Formal, Code), !.
error_code(_, engine).

formal_code(syntax_error(_), syntax_error).
formal_code(permission_error(call, sandboxed, _), unsafe).
formal_code(permission_error(catch, reserved_exception, _), unsafe).
formal_code(permission_error(throw, reserved_exception, _), unsafe).
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

%   error_data(+Error, -Pairs): machine-readable details.  Every value is
%   a small integer or a bounded text (cod_text.pl): an application may
%   throw any term in these places.
error_data(error(Formal, Context), Data) :-
    nonvar(Context), !,
    findall(K-V, ( error_datum(Formal, Context, K, V)
                 ; formal_datum(Formal, K, V) ), Data).
error_data(error(Formal, _), Data) :- !,
    findall(K-V, formal_datum(Formal, K, V), Data).
error_data(_, []).

formal_datum(permission_error(catch, reserved_exception, _), predicate, "catch/3") :- !.
formal_datum(permission_error(throw, reserved_exception, _), predicate, "throw/1") :- !.
formal_datum(permission_error(_, _, Culprit), predicate, S) :-
    culprit_pi(Culprit, S).
formal_datum(existence_error(procedure, Culprit), predicate, S) :-
    culprit_pi(Culprit, S).
formal_datum(resource_error(cod_quota(What, _)), quota, S) :-
    bounded_plain(What, S).
formal_datum(resource_error(cod_quota(_, Max)), limit, Max) :-
    small_integer(Max).
formal_datum(resource_error(R), resource, S) :-
    R \= cod_quota(_, _),
    bounded_plain(R, S).

error_datum(syntax_error(_), Ctx, line, L) :- ctx_position(Ctx, L, _), small_integer(L).
error_datum(syntax_error(_), Ctx, column, C) :- ctx_position(Ctx, _, C), small_integer(C).
error_datum(_, fact(I, _), index, I) :- small_integer(I).
error_datum(_, inference_limit(N), inference_limit, N) :- small_integer(N).

small_integer(I) :-
    integer(I), I >= 0, I =< 1 << 53.

ctx_position(text_position(L, C), L, C).
ctx_position(fact(_, Ctx), L, C) :- ctx_position(Ctx, L, C).

%   culprit_pi(+Culprit, -Text): a predicate indicator (or the term) as
%   bounded text.
culprit_pi(V, "_") :- var(V), !.
culprit_pi(M:G, S) :- !,
    culprit_pi(G, S0),
    (   atom(M), sub_atom(M, 0, _, _, app_) -> S = S0
    ;   bounded_text(M, MS),
        format(string(S), '~s:~s', [MS, S0])
    ).
culprit_pi(Name/Arity, S) :- !,
    bounded_text(Name, NS),
    bounded_text(Arity, AS),
    format(string(S), '~s/~s', [NS, AS]).
culprit_pi(G, S) :-
    callable(G), !,
    functor(G, Name, Arity),
    culprit_pi(Name/Arity, S).
culprit_pi(G, S) :-
    bounded_text(G, S).

%   error_message(+Error, -Message): one readable line, at most
%   bounded_line/2 long.  Made by format/3 with our own format strings;
%   whatever part of Error an application may have chosen goes in as a
%   text written by cod_text.pl (no hook, goal, message translation or
%   format directive of the application's term ever runs).
error_message(E, Message) :-
    (   catch(message_text(E, M0), _, fail)
    ->  true
    ;   bounded_text(E, T),
        format(string(M0), 'uncaught exception: ~s', [T])
    ),
    bounded_line(M0, Message).

%   q(+Term, -Text): Term written quoted and bounded.
q(T, S) :- bounded_text(T, S).

%   num(+N, -Text): an integer with digit groups, or N written bounded.
num(N, S) :-
    (   integer(N), abs(N) < 10^30
    ->  format(string(S), '~D', [N])
    ;   q(N, S)
    ).

message_text(cod_limit(time), "query exceeded its time limit") :- !.
message_text(cod_limit(cancelled), "query cancelled by its client") :- !.
message_text(time_limit_exceeded, "query exceeded its time limit") :- !.
message_text(inference_limit_exceeded, "query exceeded its inference limit") :- !.
message_text(error(permission_error(call, sandboxed, Name/Arity), cod_guard(_)), M) :-
    atom(Name), integer(Arity),
    denied_reason(Name, Arity, Why), !,
    q(Name, N),
    format(string(M), 'unsafe goal: calling ~s/~w is not allowed in the sandbox: ~s', [N, Arity, Why]).
message_text(error(permission_error(call, sandboxed, PI), cod_guard(PI, Why)), M) :- !,
    culprit_pi(PI, P),
    guard_reason(Why, W),
    format(string(M), 'unsafe goal: ~s: ~s', [P, W]).
message_text(error(permission_error(catch, reserved_exception, C), cod_guard(PI)), M) :- !,
    culprit_pi(PI, P),
    (   var(C)
    ->  format(string(M), 'unsafe goal: ~s must name the exceptions it catches (its catcher is unbound, so it would catch the SKB\'s time and inference limits)', [P])
    ;   q(C, CS),
        format(string(M), 'unsafe goal: ~s may not catch ~s: the SKB\'s limits throw it', [P, CS])
    ).
message_text(error(permission_error(throw, reserved_exception, B), cod_guard(_)), M) :- !,
    (   var(B)
    ->  M = "unsafe goal: throw/1 must name what it throws (its ball is unbound when the goal is checked, so it could be one of the exceptions the SKB reserves for its limits and its own control)"
    ;   q(B, BS),
        format(string(M), 'unsafe goal: throw/1 may not throw ~s: the SKB reserves it for its limits and its own control', [BS])
    ).
message_text(error(domain_error(operator_fact, F), _), M) :- !,
    q(F, FQ),
    bounded_text(F, [ignore_ops(true)], FK),
    format(string(M), '~s is read as the operator term ~s, not as a fact: a fact\'s name is one word, such as db_rtime', [FQ, FK]).
message_text(error(domain_error(ground_fact, F), _), M) :- !,
    bounded_text(F, [ignore_ops(true)], FK),
    format(string(M), 'a fact must be ground (no variables): ~s; a word starting with a capital letter or _ is a variable in Prolog, quote it (e.g. \'Zurich\')', [FK]).
message_text(time_limit_exceeded(_), "query exceeded its time limit") :- !.
message_text(error(permission_error(call, sandboxed, G), Ctx), M) :- !,
    culprit_pi(G, PI),
    reached_from(Ctx, Via),
    format(string(M), 'unsafe goal: calling ~s is not allowed in the sandbox~s', [PI, Via]).
message_text(error(instantiation_error, sandbox(G, _)), M) :- !,
    q(G, GS),
    format(string(M), 'unsafe goal: the sandbox cannot tell which predicate ~s calls (meta-calls must name their goal)', [GS]).
message_text(error(permission_error(call, module_qualified, _), _), M) :- !,
    M = "unsafe goal: module-qualified goals are not allowed (an application sees only its own facts and the system predicates)".
message_text(error(permission_error(call, database_change, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), 'unsafe goal: ~s changes the database; use add_facts/remove_facts instead', [S]).
message_text(error(permission_error(modify, static_procedure, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), 'cannot redefine ~s: it is a built-in, system-level or library predicate', [S]).
message_text(error(permission_error(modify, module, Q), _), M) :- !,
    q(Q, S),
    format(string(M), 'cannot write into another namespace: ~s', [S]).
message_text(error(permission_error(execute, directive, D), _), M) :- !,
    q((:- D), S),
    format(string(M), 'directives are not allowed: ~s', [S]).
message_text(error(resource_error(cod_quota(What, Max)), usage(What, Value)), M) :- !,
    quota_what(What, Text),
    num(Value, V), num(Max, X),
    format(string(M), 'quota exceeded: this would hold ~s ~w, the limit is ~s', [V, Text, X]).
message_text(error(resource_error(cod_reply(Bytes, Max)), _), M) :- !,
    num(Bytes, B), num(Max, X),
    format(string(M), 'answer too large: ~s bytes, the limit is ~s (ask for fewer solutions or smaller terms)', [B, X]).
message_text(error(representation_error(cod_answer_depth), max_depth(D)), M) :- !,
    num(D, DS),
    format(string(M), 'answer too deeply nested to send: more than ~s levels', [DS]).
message_text(error(representation_error(cod_integer_size), digits(D)), M) :- !,
    num(D, DS),
    format(string(M), 'answer holds an integer too large to send: more than ~s digits', [DS]).
message_text(error(domain_error(finite_time_limit, T), _), M) :- !,
    q(T, TS),
    format(string(M), 'the time limit must be a finite positive number of seconds, not ~s', [TS]).
message_text(error(permission_error(modify, procedure, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), '~s is a procedure of this application: facts cannot be added to it', [S]).
message_text(error(permission_error(modify, fact_predicate, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), '~s holds facts of this application: a procedure cannot redefine it (remove the facts first)', [S]).
message_text(error(permission_error(access, cod_token, _), _), M) :- !,
    M = "this capability is not valid (its connection to the Resource Manager has ended, or it was never issued)".
message_text(error(resource_error(inferences), inference_limit(N)), M) :- !,
    num(N, NS),
    format(string(M), 'query exceeded its inference limit (~s inferences)', [NS]).
message_text(error(resource_error(cod_query_worker), _), M) :- !,
    M = "the engine thread running this query died (it was counted out of the pool; ask again)".
message_text(error(resource_error(cod_query_pool), _), M) :- !,
    M = "the engine's query pool is not serving (it is being restarted)".
message_text(error(resource_error(cod_stack_grant(Small, Wait)), _), M) :- !,
    num(Small, SS), num(Wait, WS),
    format(string(M), 'query needs more than ~s bytes of stack, and none of the engine''s larger stacks came free within ~s s (other queries hold them: ask again later)', [SS, WS]).
message_text(error(resource_error(c_stack), _), M) :- !,
    M = "query ran out of C stack: a term nested too deeply to read, write or compare (a query's thread has 1 MB of it)".
message_text(error(resource_error(Stack), Ctx), M) :-
    memberchk(Stack, [stack, global_stack, local_stack, trail_stack]),
    is_dict(Ctx), get_dict(stack_limit, Ctx, KB), integer(KB), !,
    MB is KB // 1024,
    num(MB, MS),
    format(string(M), 'query ran out of stack: it may use ~s MB', [MS]).
message_text(error(resource_error(R), _), M) :- !,
    bounded_plain(R, RS),
    format(string(M), 'query ran out of resources: ~s (memory limit of the engine)', [RS]).
message_text(error(syntax_error(What), Ctx), M) :-
    ctx_position(Ctx, L, C), !,
    syntax_what(What, W),
    num(L, LS), num(C, CS),
    format(string(M), 'syntax error at line ~s, column ~s: ~s', [LS, CS, W]).
message_text(error(syntax_error(What), _), M) :- !,
    syntax_what(What, W),
    format(string(M), 'syntax error: ~s', [W]).
message_text(error(existence_error(procedure, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), 'unknown procedure ~s', [S]).
message_text(error(domain_error(cod_app_name, App), _), M) :- !,
    q(App, S),
    format(string(M), 'invalid application name ~s: 1 to 128 bytes of printable UTF-8, no control characters', [S]).
message_text(error(domain_error(cod_system_fact, PI), _), M) :- !,
    culprit_pi(PI, S),
    format(string(M), '~s is not a system-level predicate of the SKB schema', [S]).
message_text(error(failed(_), _), "operation failed") :- !.
message_text(error(Formal, Ctx), M) :- !,
    (   iso_text(Formal, Core)
    ->  true
    ;   q(Formal, F),
        format(string(Core), 'Unknown error term: ~s', [F])
    ),
    caller_prefix(Ctx, Prefix),
    context_comment(Ctx, Comment),
    atomics_to_string([Prefix, Core, Comment], M).
message_text(E, M) :-
    q(E, S),
    format(string(M), 'uncaught exception: ~s', [S]).

%   iso_text(+Formal, -Text): the ISO error terms, in the words of
%   SWI-Prolog's own messages, with every culprit written bounded.
iso_text(V, _) :- var(V), !, fail.
iso_text(instantiation_error, "Arguments are not sufficiently instantiated").
iso_text(type_error(evaluable, A), T) :-
    callable(A), !,
    q(A, AS),
    format(string(T), 'Arithmetic: `~s\' is not a function', [AS]).
iso_text(type_error(E, A), T) :-
    bounded_plain(E, ES),
    q(A, AS),
    type_of(A, Type),
    (   sub_atom(Type, 0, 1, _, F), memberchk(F, [a, e, i, o, u]) -> Art = an ; Art = a ),
    format(string(T), 'Type error: `~s\' expected, found `~s\' (~w ~w)', [ES, AS, Art, Type]).
iso_text(domain_error(D, A), T) :-
    (   nonvar(D), D = range(L, H)
    ->  q(L, LS), q(H, HS), format(string(DS), '[~s..~s]', [LS, HS])
    ;   bounded_plain(D, D0), format(string(DS), '`~s\'', [D0])
    ),
    q(A, AS),
    format(string(T), 'Domain error: ~s expected, found `~s\'', [DS, AS]).
iso_text(uninstantiation_error(V), T) :-
    q(V, VS),
    format(string(T), 'Uninstantiated argument expected, found ~s', [VS]).
iso_text(representation_error(W), T) :-
    bounded_plain(W, WS),
    format(string(T), 'Cannot represent due to `~s\'', [WS]).
iso_text(permission_error(A, Ty, O), T) :-
    bounded_plain(A, AS), bounded_plain(Ty, TS), q(O, OS),
    format(string(T), 'No permission to ~s ~s `~s\'', [AS, TS, OS]).
iso_text(evaluation_error(W), T) :-
    q(W, WS),
    format(string(T), 'Arithmetic: evaluation error: `~s\'', [WS]).
iso_text(existence_error(Ty, O), T) :-
    bounded_plain(Ty, TS), q(O, OS),
    format(string(T), '~s `~s\' does not exist', [TS, OS]).
iso_text(existence_error(Ty, O, In), T) :-
    bounded_plain(Ty, TS), q(O, OS), q(In, IS),
    format(string(T), '~s `~s\' does not exist in ~s', [TS, OS, IS]).
iso_text(resource_error(R), T) :-
    bounded_plain(R, RS),
    format(string(T), 'Not enough resources: ~s', [RS]).

type_of(T, Type) :-
    (   var(T) -> Type = var
    ;   integer(T) -> Type = integer
    ;   float(T) -> Type = float
    ;   rational(T) -> Type = rational
    ;   T == [] -> Type = empty_list
    ;   atom(T) -> Type = atom
    ;   string(T) -> Type = string
    ;   is_dict(T) -> Type = dict
    ;   compound(T) -> Type = compound
    ;   Type = blob
    ).

%   caller_prefix(+Context, -Text): "name/arity: " of the built-in that
%   raised an error, as SWI-Prolog writes it.
caller_prefix(Ctx, P) :-
    nonvar(Ctx), Ctx = context(Caller, _), nonvar(Caller), ground(Caller), !,
    (   Caller = M:PI, atom(M), hidden_module(M), PI = _/_
    ->  culprit_pi(PI, S)
    ;   ( Caller = _:_/_ ; Caller = _/_ )
    ->  culprit_pi(Caller, S)
    ;   q(Caller, S)
    ),
    string_concat(S, ": ", P).
caller_prefix(_, "").

hidden_module(M) :- memberchk(M, [system, user]), !.
hidden_module(M) :- sub_atom(M, 0, _, _, '$').
hidden_module(M) :- sub_atom(M, 0, _, _, app_).

%   context_comment(+Context, -Text): the message of context(_, Message).
context_comment(Ctx, C) :-
    nonvar(Ctx), Ctx = context(_, Msg), nonvar(Msg), Msg \== '', !,
    bounded_plain(Msg, S),
    format(string(C), ' (~s)', [S]).
context_comment(_, "").

%   guard_reason(+Why, -Text): why the deny layer refused a goal whose
%   arguments it checks (cod_guard.pl).
guard_reason(Why, T) :-
    (   guard_text(Why, T0) -> T = T0
    ;   q(Why, T)
    ).

guard_text(internal, "predicates whose names start with $ are the engine's own internals (what they read or do is the engine's, not the application's)").
guard_text(format_directive(D), T) :-
    bounded_plain(D, DS),
    format(string(T), 'the format directive ~~~s is not allowed (~~@ runs a goal, ~~p calls print hooks, ~~W takes write options that can call a goal)', [DS]).
guard_text(format_argument(D, N, Max), T) :-
    bounded_plain(D, DS), q(N, NS), num(Max, MS),
    format(string(T), 'the numeric argument ~s of the format directive ~~~s is over ~s (column stops, counts and precisions are bounded)', [NS, DS, MS]).
guard_text(format_star(D, Max), T) :-
    bounded_plain(D, DS), num(Max, MS),
    format(string(T), 'the argument of ~~*~s must be an integer of at most ~s written in the goal itself (column stops, counts and precisions are bounded)', [DS, MS]).
guard_text(format_string(F), T) :-
    q(F, FS),
    format(string(T), 'the format string must be written in the goal, as text the SKB can check: ~s', [FS]).
guard_text(write_option(O), T) :-
    q(O, OS),
    format(string(T), 'the write option ~s is not allowed (options must be a list written in the goal, of quoted, ignore_ops, max_depth, numbervars, variable_names and other options that only change the layout)', [OS]).
guard_text(statistics_key(K), T) :-
    q(K, KS),
    format(string(T), 'the key ~s is not allowed: an application may read only its own cputime, inferences, runtime, walltime or real_time', [KS]).
guard_text(prolog_flag(F), T) :-
    q(F, FS),
    format(string(T), 'the flag ~s is not readable by applications (and the flag must be named in the goal)', [FS]).

syntax_what(What, W) :-
    (   atom(What), atom_length(What, L), L =< 200
    ->  atomic_list_concat(Parts, '_', What),
        atomic_list_concat(Parts, ' ', W0),
        atom_string(W0, W)
    ;   bounded_plain(What, W)
    ).

reached_from(sandbox(_, Parents), Via) :-
    is_list(Parents), last(Parents, Top), !,
    culprit_pi(Top, PI),
    format(string(Via), ' (reached from ~s)', [PI]).
reached_from(_, "").

quota_what(facts, facts).
quota_what(fact_chars, 'characters of facts').
quota_what(clauses, 'clauses of procedures').
quota_what(clause_chars, 'characters of procedures').
