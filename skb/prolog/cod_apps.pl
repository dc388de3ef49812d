/*  COD SKB: application namespaces, untrusted code, limited queries.
*/

:- module(cod_apps,
          [ drop_owner/3,          % +App, +Owner, -Count
            release_app/1,         % +App
            drop_app/1,            % +App
            describe_app/3,        % +App, -Procedures, -FactCounts
            app_snapshot/2,        % -App, -State
            restore_app/2          % +App, +State
          ]).
:- reexport(cod_namespaces,
            [ app_module/2, existing_app_module/2, valid_app_name/1, app/2, empty_app/2, destroy_app/2,
              app_usage/2, with_declarations/1, register_library/1, library_module/1 ]).
:- reexport(cod_parse, [parse_terms/4]).
:- reexport(cod_facts, [add_facts/5, remove_facts/3, list_facts/3]).
:- reexport(cod_procedures, [add_procedure/5, list_procedures/2]).
:- reexport(cod_queries, [run_query/4, evaluate/5]).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(pairs)).
:- use_module(cod_namespaces).
:- use_module(cod_facts).
:- use_module(cod_procedures).

/** <module> Applications of the COD SKB

Every application gets its own Prolog module (cod_namespaces.pl).  This
module is what the server uses of them: it exports the operations on an
application as a whole (a connection leaving, the last one leaving, its
snapshot and restore) and re-exports those of its parts:

  - cod_namespaces.pl: the namespaces, what each holds, usage and quotas,
    which heads an application may define, declarations undone with a write;
  - cod_parse.pl: reading what an application sends;
  - cod_checks.pl: the checks of its goals (qualification, the sandbox);
  - cod_facts.pl: facts and their owners;
  - cod_procedures.pl: procedures;
  - cod_queries.pl: queries and evaluations before a write.

Everything an application sends is untrusted:

  1. Facts must be ground and named by a word; facts and clause heads may
     not define a built-in, a system-level or a library predicate
     (permission_error(modify, static_procedure, PI)).
  2. Clause bodies and query goals may not be module-qualified in a goal
     position, and must pass library(sandbox)'s safe_goal/1 with the deny
     layer of cod_guard.pl in front of it.
  3. Queries run under a wall-clock time limit and an inference limit that
     they cannot catch (cod_limits.pl), the thread's stack limit, inside a
     snapshot/1, with the standard streams bound to empty streams.
  4. Facts and clauses are counted per application (usage/5), and an add
     that would pass the limits the caller gives is refused whole.

Facts remember who added them: drop_owner/3 removes exactly the facts a
leaving connection added and nobody else holds; release_app/1 removes what
is left but persistent facts and procedures when the application's last
connection leaves, and frees the module when nothing is left.

All writers run in the SKB server's writer thread, each inside a
transaction/1 (see cod_server.pl): an exception anywhere undoes the whole
operation.
*/

%!  drop_owner(+App, +Owner, -Count) is det.
%
%   Owner (a leaving connection, conn(Id)) no longer holds its facts:
%   Count facts that nobody else holds are removed.
drop_owner(App, Owner, Count) :-
    must_be(ground, Owner),
    (   app(App, M)
    ->  findall(Ref, ( fact_owner(Ref, Owner), clause_module(Ref, M) ), Refs),
        foldl(drop_ref_owner(M, Owner), Refs, 0, Count),
        forget_safe_goals(M)
    ;   Count = 0
    ).

drop_ref_owner(M, Owner, Ref, N0, N) :-
    retractall(fact_owner(Ref, Owner)),
    (   fact_owner(Ref, _)
    ->  N = N0
    ;   erase_fact(M, Ref),
        N is N0 + 1
    ).

%!  release_app(+App) is det.
%
%   The application's last connection left: remove every fact nobody holds
%   persistently and every procedure not added as persistent; when nothing
%   is left, forget the application and free its module.
release_app(App) :-
    (   app(App, M)
    ->  findall(Ref, ( fact_ref(M, Ref), \+ fact_owner(Ref, persistent) ), Refs),
        forall(member(Ref, Refs), erase_fact(M, Ref)),
        forall(procedure(M, PI, false, _), remove_procedure(M, PI)),
        forget_safe_goals(M)
    ;   true
    ).

%!  drop_app(+App) is det.
%
%   Forget every fact and procedure of App, whoever holds them.
drop_app(App) :-
    (   app(App, M)
    ->  findall(Ref, fact_ref(M, Ref), Refs),
        forall(member(Ref, Refs), erase_fact(M, Ref)),
        forall(procedure(M, PI, _, _), remove_procedure(M, PI)),
        forget_safe_goals(M)
    ;   true
    ).

%!  app_snapshot(-App, -State) is nondet.
%
%   State of every application that holds anything, one solution each, as
%   text that restore_app/2 reads back: state(Facts, Procedures, Declared),
%   Facts a list of Text-Owners, Procedures a list of Text-Persistent (one
%   per predicate), Declared the Name/Arity of each fact predicate that
%   holds no fact now (a query of it fails, where an unknown one raises an
%   existence error: a restarted engine must answer the same).
app_snapshot(App, State) :-
    app(App, M),
    app_state(M, State).

%   app_state(+Module, -State) is semidet: fails when Module holds nothing.
app_state(M, state(Facts, Procs, Declared)) :-
    findall(Text-Owners,
            ( fact_ref(M, Ref),
              clause(M:H, true, Ref),
              format(string(Text), '~k', [H]),
              findall(O, fact_owner(Ref, O), Owners)
            ),
            Facts),
    findall(Text-P,
            ( procedure(M, Name/Arity, P, _),
              procedure_text(M, Name/Arity, Text)
            ),
            Procs),
    findall(Name/Arity, empty_fact_predicate(M, Name, Arity), Declared),
    \+ ( Facts == [], Procs == [], Declared == [] ).

%   empty_fact_predicate(+M, -Name, -Arity): a predicate of M's own facts
%   (dynamic, defined in M, not a procedure) that holds no clause.
empty_fact_predicate(M, Name, Arity) :-
    current_predicate(M:Name/Arity),
    functor(H, Name, Arity),
    \+ predicate_property(M:H, imported_from(_)),
    predicate_property(M:H, dynamic),
    \+ procedure(M, Name/Arity, _, _),
    \+ clause(M:H, _).

%!  restore_app(+App, +State) is det.
%
%   Load a state written by app_snapshot/2 into an application that holds
%   nothing yet.
%   @error permission_error(modify, static_procedure, PI) if a declared
%          predicate is not one an application may hold facts of.
restore_app(App, state(Facts, Procs, Declared)) :-
    must_be(list, Declared),
    forall(member(Text-P, Procs),
           add_procedure(App, Text, P, none, _)),
    forall(member(Text-Owners, Facts),
           forall(member(O, Owners), add_facts(App, O, [Text], none, _))),
    app_module(App, M),
    forall(member(PI, Declared), declare_fact_predicate(M, PI)).

declare_fact_predicate(M, PI) :-
    must_be(ground, PI),
    (   PI = Name/Arity, atom(Name), integer(Arity), Arity >= 0
    ->  true
    ;   type_error(predicate_indicator, PI)
    ),
    functor(H, Name, Arity),
    check_head(M, H),
    (   predicate_property(M:H, defined)
    ->  true
    ;   declare_pending(M, PI)
    ).

%!  describe_app(+App, -Procedures, -FactCounts) is det.
%
%   Procedures: proc(Name/Arity, ClauseTexts, Persistent) for each procedure of
%   App; FactCounts: (Name/Arity)-Count for each predicate holding facts.
describe_app(App, Procs, Counts) :-
    (   app(App, M)
    ->  findall(proc(PI, Texts, P), ( procedure(M, PI, P, _), procedure_listing(M, PI, Texts) ), Procs),
        findall(Name/Arity, ( fact_ref(M, Ref), clause(M:H, true, Ref), functor(H, Name, Arity) ), PIs),
        msort(PIs, Sorted),
        clumped(Sorted, Counts)
    ;   Procs = [], Counts = []
    ).
