/*  COD SKB: an application's procedures (stored procedures of its own).
*/

:- module(cod_procedures,
          [ add_procedure/5,       % +App, +Text, +Persistent, +Limits, -PIs
            remove_procedure/2,    % +Module, +Name/Arity
            list_procedures/2,     % +App, -Texts
            procedure_text/3,      % +Module, +Name/Arity, -Text
            procedure_listing/3    % +Module, +Name/Arity, -Texts
          ]).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- use_module(cod_namespaces).
:- use_module(cod_parse).
:- use_module(cod_checks).

/** <module> Application procedures

A procedure's clauses replace whatever the application defined before for
the same predicates, all or nothing; their bodies pass the checks of
cod_checks.pl, with predicates of the application not yet defined declared
for the check (and undone with the write if it fails).
*/

%!  add_procedure(+App, +Text, +Persistent, +Limits, -PIs) is det.
%
%   Add one or more clauses.  Every predicate defined in Text replaces
%   any previous definition of that predicate in App (so a client that
%   sends its cost function again does not get duplicate answers).
%   All or nothing: if any clause is rejected, nothing changes.
%   Persistent (true/false): the procedure outlives the application's
%   last connection.
add_procedure(App, Text, Persistent, Limits, PIs) :-
    must_be(boolean, Persistent),
    app_module(App, M),
    parse_terms(M, Text, Terms, [clauses]),
    (   Terms == []
    ->  domain_error(procedure_text, Text)
    ;   true
    ),
    maplist(clause_parts, Terms, Clauses),
    maplist(check_clause_head(M), Clauses),
    findall(PI, ( member(H-_, Clauses), pi_of(H, PI) ), PIs0),
    sort(PIs0, PIs),
    forall(( member(PI, PIs), fact_predicate(M, PI) ),
           permission_error(modify, fact_predicate, PI)),
    % Heads first, so that clauses may call one another.  Predicates
    % declared for the check (and the new ones defined here) are recorded
    % in a global variable of this thread, which survives the exception
    % that undoes bindings and the end of a snapshot: the caller forgets
    % them after a committed write, or undoes them (see with_declarations/1).
    check_clause_bodies(M, PIs, Clauses),
    string_length(Text, Len),
    length(Clauses, NC),
    length(PIs, NP),
    forall(member(PI, PIs), remove_procedure(M, PI)),
    forall(member(H-B, Clauses), assertz(M:(H:-B))),
    Share is Len // max(1, NP),
    forall(member(PI, PIs), assertz(procedure(M, PI, Persistent, Share))),
    add_usage(M, 0, 0, NC, Len),
    check_limits(M, Limits),
    forget_safe_goals(M).

remove_procedure(M, Name/Arity) :-
    (   retract(procedure(M, Name/Arity, _, Chars))
    ->  functor(H, Name, Arity),
        aggregate_all(count, retract(M:(H:-_)), N),
        Minus is -N, MinusChars is -Chars,
        add_usage(M, 0, 0, Minus, MinusChars)
    ;   true
    ).

clause_parts(Term-_, H-B) :-
    (   Term = (H0:-B0)
    ->  H = H0, B = B0
    ;   Term = (:-D)
    ->  permission_error(execute, directive, D)
    ;   Term = (_-->_)
    ->  domain_error(clause, Term)
    ;   H = Term, B = true
    ).

check_clause_head(M, H-_) :-
    check_head(M, H).

pi_of(H, Name/Arity) :-
    functor(H, Name, Arity).

check_clause_bodies(M, PIs, Clauses) :-
    maplist(declare_if_new(M), PIs),
    maplist(check_body(M), Clauses).

declare_if_new(M, Name/Arity) :-
    functor(H, Name, Arity),
    (   predicate_property(M:H, defined)
    ->  true
    ;   declare_pending(M, Name/Arity)
    ).

check_body(M, _H-Body) :-
    check_goal_qualification(M, Body),
    check_safe(M, Body).

procedure_text(M, Name/Arity, Text) :-
    functor(H, Name, Arity),
    findall(C, ( clause(M:H, B), clause_term(H, B, C) ), Clauses),
    with_output_to(string(Text),
                   forall(member(C, Clauses),
                          format('~k.~n', [C]))).

%   procedure_listing(+Module, +PI, -Texts): each clause as a person would
%   write it (portray_clause/2: layout, variables named A, B, ...).
procedure_listing(M, Name/Arity, Texts) :-
    functor(H, Name, Arity),
    findall(Text,
            ( clause(M:H, B),
              clause_term(H, B, C),
              with_output_to(string(Text), portray_clause(C))
            ),
            Texts).

clause_term(H, true, H) :- !.
clause_term(H, B, (H:-B)).

%!  list_procedures(+App, -Texts) is det.
%
%   The procedures of App, one text per predicate.
list_procedures(App, Texts) :-
    (   app(App, M)
    ->  findall(Text, ( procedure(M, PI, _, _), procedure_text(M, PI, Text) ), Texts)
    ;   Texts = []
    ).
