/*  COD SKB: queries of an application, and evaluations before a write.
*/

:- module(cod_queries,
          [ run_query/4,           % +App, +Text, +Options, -Answer
            evaluate/5             % +App, +Staged, +Queries, +Options, -Results
          ]).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(pairs)).
:- use_module(cod_limits).
:- use_module(cod_namespaces).
:- use_module(cod_parse).
:- use_module(cod_checks).
:- use_module(cod_facts).
:- use_module(cod_procedures).

/** <module> Queries of applications

Queries run under a wall-clock time limit and an inference limit that they
cannot catch (cod_limits.pl), the thread's stack limit, inside a
snapshot/1 (so they see a consistent database while the Resource Manager
writes), with the standard streams bound to empty streams.
*/

%!  run_query(+App, +Text, +Options, -Answer) is det.
%
%   Answer is answer(Solutions, Truncated, ElapsedUs) where Solutions is a
%   list of Name-Value pair lists.  Options:
%
%     - all(Bool): all solutions (default) or the first one only
%     - max_solutions(N): at most N solutions (Truncated tells if cut)
%     - time_limit(Seconds), inference_limit(N)
run_query(App, Text, Options, answer(Solutions, Truncated, Us)) :-
    app_module(App, M),
    query_goal(M, Text, Goal, Bindings),
    option_value(all(All), Options, true),
    option_value(max_solutions(Max), Options, 10000),
    option_value(time_limit(Time), Options, 5),
    option_value(inference_limit(Inf), Options, 10000000),
    visible_bindings(Bindings, Visible),
    pairs_keys_values(Visible, Names, Vars),
    Template =.. [v|Vars],
    (   All == true
    ->  Max1 is Max + 1,
        Runner = findnsols_first(Max1, Template, M:Goal, Found)
    ;   Runner = first_solution(Template, M:Goal, Found)
    ),
    get_time(T0),
    limited(App, Runner, Time, Inf),
    get_time(T1),
    Us is round((T1-T0)*1000000),
    length(Found, NFound),
    (   NFound > Max
    ->  Truncated = true, length(Kept, Max), append(Kept, _, Found)
    ;   Truncated = false, Kept = Found
    ),
    maplist(solution_pairs(Names), Kept, Solutions).

%   query_goal(+M, +Text, -Goal, -Bindings): parse and check a query.
%   The sandbox check runs every time (its verdict cache is emptied when
%   the module changes); the parse is reused from the calling thread's
%   last query when M and Text are the same (parsed_goal/4).
query_goal(M, Text, Goal, Bindings) :-
    parsed_goal(M, Text, Goal, Bindings),
    check_query_goal(M, Goal).

%   parsed_goal(+M, +Text, -Goal, -Bindings): Text read as one callable
%   goal with M's operators.  The thread keeps its last parse (a direct
%   connection's thread serves one client, which mostly repeats a query
%   with other data): the same text in the same module gives a copy of
%   that term, with fresh variables.  The parse depends on nothing else:
%   an application cannot change its module's operators or syntax flags
%   (cod_guard.pl).  Texts over max_cached_goal_chars are not kept, so a
%   thread holds at most that much.
parsed_goal(M, Text, Goal, Bindings) :-
    (   nb_current(cod_last_goal, last(M0, Text0, Parsed)),
        M0 == M, Text0 == Text
    ->  copy_term(Parsed, Goal-Bindings)
    ;   parse_terms(M, Text, Terms, []),
        (   Terms = [Goal-Bindings]
        ->  true
        ;   Terms == []
        ->  domain_error(goal, Text)
        ;   domain_error(single_goal, Text)
        ),
        must_be(callable, Goal),
        (   string(Text), string_length(Text, Len), max_cached_goal_chars(Max), Len =< Max
        ->  nb_setval(cod_last_goal, last(M, Text, Goal-Bindings))
        ;   true
        )
    ).

max_cached_goal_chars(4096).

option_value(Opt, Options, Default) :-
    (   memberchk(Opt, Options)
    ->  true
    ;   arg(1, Opt, Default)
    ).

visible_bindings([], []).
visible_bindings([Name=Var|T0], T) :-
    (   sub_atom(Name, 0, _, _, '_')
    ->  T = T1
    ;   T = [Name-Var|T1]
    ),
    visible_bindings(T0, T1).

solution_pairs(Names, Solution, Pairs) :-
    Solution =.. [v|Values],
    (   cyclic_term(Values)
    ->  domain_error(acyclic_term, Values)
    ;   true
    ),
    pairs_keys_values(Pairs, Names, Values).

findnsols_first(N, Template, Goal, Found) :-
    findnsols(N, Template, Goal, Found), !.
findnsols_first(_, _, _, []).

first_solution(Template, Goal, [Template]) :-
    call(Goal), !.
first_solution(_, _, []).

%   limited(+App, :Runner, +Seconds, +Inferences)
%   Run with the limits, on behalf of App (see current_app/1), in a
%   snapshot of the database: the query sees one consistent state while
%   the Resource Manager writes, and whatever it might change is dropped.
limited(App, Runner, Time, Inf) :-
    b_setval(cod_app, App),
    snapshot(run_limited(Runner, Time, Inf)).

%!  evaluate(+App, +Staged, +Queries, +Options, -Results) is det.
%
%   Evaluate Queries (a list of query(GoalText, VarName) or first(GoalText))
%   in App's
%   namespace as it would be after the Staged changes (a list of
%   facts(Owner, Texts, Limits) and procedure(Text, Persistent, Limits)),
%   without making the changes: everything happens in a snapshot/1 that is
%   discarded.  Results has one element per query: value(V) (the binding
%   of VarName in the first solution) or bindings(Pairs) (for first/1: every
%   named variable), none (no solution) or error(E).
%   A staged change that is refused throws, as the real write would.
%   With the option round_limit(Seconds), no query starts once the
%   evaluation has run that long: each one left is answered skipped (a
%   round of one application's conditions is bounded by Seconds plus one
%   query's time limit, however many it holds).
evaluate(App, Staged, Queries, Options, Results) :-
    app_module(App, M),
    option_value(time_limit(Time), Options, 5),
    option_value(inference_limit(Inf), Options, 10000000),
    round_deadline(Options, Deadline),
    forget_declarations,
    catch(snapshot(evaluate_staged(App, M, Staged, Queries, limits(Time, Inf, Deadline), Results)),
          E, true),
    % Declarations made while checking staged procedures are not data:
    % snapshot/1 does not undo them.
    undo_declarations,
    (   var(E) -> true ; throw(E) ).

%   round_deadline(+Options, -Deadline): when the round's last query may
%   start (get_time/1), or none.
round_deadline(Options, Deadline) :-
    (   memberchk(round_limit(Round), Options)
    ->  must_be(number, Round),
        (   Round > 0, Round < inf -> true ; domain_error(finite_round_limit, Round) ),
        get_time(Now),
        Deadline is Now + Round
    ;   Deadline = none
    ).

evaluate_staged(App, M, Staged, Queries, Limits, Results) :-
    forall(member(Change, Staged), stage(App, Change)),
    b_setval(cod_app, App),
    maplist(evaluate_in_round(M, Limits), Queries, Results).

evaluate_in_round(M, limits(Time, Inf, Deadline), Query, Result) :-
    (   Deadline \== none, get_time(Now), Now >= Deadline
    ->  Result = skipped
    ;   evaluate_one(M, Time, Inf, Query, Result)
    ).

stage(App, facts(Owner, Texts, Limits)) :- !,
    add_facts(App, Owner, Texts, Limits, _).
stage(App, procedure(Text, Persistent, Limits)) :- !,
    add_procedure(App, Text, Persistent, Limits, _).
stage(_, Change) :-
    domain_error(staged_change, Change).

evaluate_one(M, Time, Inf, first(Text), Result) :- !,
    catch(( query_goal(M, Text, Goal, Bindings),
            visible_bindings(Bindings, Visible),
            pairs_keys_values(Visible, Names, Vars),
            Template =.. [v|Vars],
            run_limited(first_solution(Template, M:Goal, Found), Time, Inf),
            (   Found = [Solution]
            ->  solution_pairs(Names, Solution, Pairs),
                Result = bindings(Pairs)
            ;   Result = none
            )
          ),
          E,
          Result = error(E)).
evaluate_one(M, Time, Inf, query(Text, Var), Result) :-
    catch(( query_goal(M, Text, Goal, Bindings),
            atom_string(VarName, Var),
            (   memberchk(VarName=V, Bindings)
            ->  true
            ;   existence_error(variable, VarName)
            ),
            run_limited(first_solution(V, M:Goal, Found), Time, Inf),
            (   Found = [Value]
            ->  Result = value(Value)
            ;   Result = none
            )
          ),
          E,
          Result = error(E)).
