/*  COD SKB: the checks every goal of an application passes before it runs.
*/

:- module(cod_checks,
          [ check_goal_qualification/2, % +Module, +Goal
            check_safe/2,               % +Module, +Goal
            check_query_goal/2          % +Module, +Goal
          ]).
:- use_module(library(sandbox)).
:- use_module(library(lists)).
:- use_module(cod_namespaces).
:- use_module(cod_grants, [ensure_stack_room/1]).

/** <module> Checks of application goals

Clause bodies and query goals may not be module-qualified in a goal
position, may not name the engine's `$` internals, and must pass
library(sandbox)'s safe_goal/1 with the deny layer of cod_guard.pl in
front of it.  A query goal found safe is remembered (by its variant hash)
until its namespace changes.
*/

%!  check_goal_qualification(+Module, +Goal) is det.
%
%   Reject module qualification (M:G, G@M) in goal positions of Goal: the
%   goal itself, control constructs and the meta-arguments of the
%   predicates it calls.  `:` in data (meeting(time(12:30))) is data.
%   Qualification built at run time cannot be called: the sandbox refuses
%   calls it cannot resolve, and the reflective predicates that take a
%   head as data are denied (cod_guard.pl).  A goal named with a `$` is
%   refused too: those are the engine's internals ('$search_path_file_cache'/3
%   reads the engine's file paths, '$loading'/1 its state).  They stay
%   callable by the library code that uses them, which sandbox checks
%   through the same layer, so they are refused here, where the
%   application's own goals are, and not in cod_guard.pl.
check_goal_qualification(M, Goal) :-
    goal_position(M, Goal, 0).

goal_position(_, G, _) :-
    var(G), !.
goal_position(_, G, _) :-
    G = Q:_, !,
    permission_error(call, module_qualified, Q:(:)/2).
goal_position(_, G, _) :-
    G = @(_, Q), !,
    permission_error(call, module_qualified, Q:(@)/2).
goal_position(_, G, Extra) :-
    callable(G),
    functor(G, Name, Arity0),
    sub_atom(Name, 0, _, _, $), !,
    Arity is Arity0 + Extra,
    throw(error(permission_error(call, sandboxed, Name/Arity), cod_guard(Name/Arity, internal))).
goal_position(M, G, Extra) :-
    callable(G),
    (   Extra > 0
    ->  G =.. L0, length(Pad, Extra), append(L0, Pad, L), G1 =.. L
    ;   G1 = G
    ),
    (   control_goal(G1, Subs)
    ->  forall(member(S, Subs), goal_position(M, S, 0))
    ;   catch(predicate_property(M:G1, meta_predicate(Spec)), _, fail)
    ->  G1 =.. [_|Args], Spec =.. [_|Specs],
        forall(nth1(I, Specs, S),
               (   meta_extra(S, E)
               ->  nth1(I, Args, A), strip_existential(A, A1),
                   goal_position(M, A1, E)
               ;   true
               ))
    ;   true
    ), !.
goal_position(_, _, _).

control_goal((A,B), [A,B]).
control_goal((A;B), [A,B]).
control_goal((A->B), [A,B]).
control_goal((A*->B), [A,B]).
control_goal(\+(A), [A]).
control_goal(call(A), [A]).
control_goal(findall(_,G,_), [G]).
control_goal(forall(C,A), [C,A]).

meta_extra(N, N) :- integer(N), !.
meta_extra(^, 0).
meta_extra(//, 2).

strip_existential(V, V) :- var(V), !.
strip_existential(_^G0, G) :- !, strip_existential(G0, G).
strip_existential(G, G).

%   check_safe(+M, +Goal)
%   Run the sandbox.  A call to a not-yet-defined predicate of the
%   application's own module is not a safety issue: declare it (dynamic,
%   no clauses) and check again, so the rest of the body is still checked.
check_safe(M, Goal) :-
    catch(checked_with_room(M:Goal), Error, true),
    (   var(Error)
    ->  true
    ;   Error = error(existence_error(procedure, M:Undef), _),
        callable(Undef),
        functor(Undef, Name, Arity),
        pending_declarations(Pending),
        \+ memberchk(M:Name/Arity, Pending)
    ->  declare_pending(M, Name/Arity),
        check_safe(M, Goal)
    ;   throw(Error)
    ).

check_query_goal(M, Goal) :-
    variant_sha1(Goal, Hash),
    (   safe_goal_known(Hash, M)
    ->  true
    ;   check_goal_qualification(M, Goal),
        checked_with_room(M:Goal),
        remember_safe_goal(Hash, M)
    ).

%   checked_with_room(+M:Goal): safe_goal/1 once the calling thread has
%   check_room_bytes of its stack limit free (ensure_stack_room/1), so that
%   the check does not run out inside clause/3, whatever the request holds.
%   A check allocates with the code it walks: at most 0.4 MB for any one
%   admitted predicate with garbage collection off (docs/security.md, "A
%   check never runs out of stack").
checked_with_room(Goal) :-
    check_room_bytes(Room),
    ensure_stack_room(Room),
    safe_goal(Goal).

check_room_bytes(1048576).
