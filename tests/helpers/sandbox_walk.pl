/*  The sandbox walk's census (tests/skb/test_skb_sandbox_walk.py): every predicate an application's
    code may call, as the SKB server would admit it.

    Loaded after cod_server.pl into a throw-away swipl, it does what the server's start does to the
    predicates applications see (the stored procedures loaded and registered, autoload_all, then
    autoloading off), makes an application's namespace, and asks library(sandbox), with the deny
    layer of cod_guard.pl in front, about every predicate visible there: the system predicates
    ('$'-named ones too), those of the libraries every application imports, cod_sys and the stored
    procedures.  A predicate is admitted when the checks of an application's goal (cod_apps's
    goal positions, then safe_goal/1) accept it with some filling of its arguments (all unbound, or all one sample value; meta-arguments a closure of their arity).

    Prints one line per admitted predicate: Name/Arity (quoted), a tab, the module it comes from,
    a tab, and its argument kinds, one word each (m and its spec: a meta-argument, given a closure
    of that arity, m0 also for an argument admitted only as a goal; a: any other), e.g.
    `maplist/3  apply  m1 a a`.
*/

:- module(sandbox_census, [census/1]).
:- use_module(library(sandbox)).
:- use_module(library(lists)).
:- use_module(library(apply)).

census(LibraryDir) :-
    directory_files(LibraryDir, Entries),
    forall(( member(E, Entries), file_name_extension(_, pl, E) ),
           ( directory_file_path(LibraryDir, E, File),
             cod_server:load_library_file(File, _) )),
    autoload_all,
    set_prolog_flag(autoload, false),
    cod_apps:app_module(sandbox_census, M),
    findall(N/A, candidate(M, N, A), PIs0),
    sort(PIs0, PIs),
    forall(( member(N/A, PIs), admitted(M, N, A, Head) ),
           print_admitted(M, N, A, Head)).

candidate(_, N, A) :- predicate_property(system:H, defined), functor(H, N, A).
candidate(M, N, A) :- predicate_property(M:H, visible), functor(H, N, A).
candidate(M, N, A) :-
    import_module(M, Super),
    Super \== system,
    (   module_property(Super, exports(PIs)), member(N/A, PIs)
    ;   current_predicate(Super:N/A)
    ).
candidate(_, N, A) :-
    cod_apps:library_module(L), module_property(L, exports(PIs)), member(N/A, PIs).

%   admitted(+M, +N, +A, -Head): N/A, called from M, passes the checks with Head's arguments.
admitted(M, N, A, Head) :-
    functor(Head0, N, A),
    catch(predicate_property(M:Head0, visible), _, fail),
    sample(S),
    copy_term(Head0, Head),
    fill(M, Head, S),
    catch(( cod_checks:check_goal_qualification(M, Head), safe_goal(M:Head) ), _, fail),
    !.

sample(unbound).
sample(true).     % a goal: for meta-predicates that declare no meta-arguments (tabled_call/1)
sample(a).
sample(1).
sample([]).
sample("~w").

fill(M, Head, S) :-
    Head =.. [_|Args],
    (   predicate_property(M:Head, meta_predicate(Spec))
    ->  Spec =.. [_|Specs]
    ;   length(Args, L), length(Specs, L), maplist(=(?), Specs)
    ),
    maplist(fill_arg(S), Specs, Args).

fill_arg(S, Spec, Arg) :-
    (   closure(Spec, C)
    ->  Arg = C
    ;   S == unbound
    ->  true
    ;   Arg = S
    ).

%   A closure for each meta-argument spec: callable with that many more arguments.
closure(0, true).
closure(1, var).
closure(2, =).
closure(3, plus).
closure(4, nth0).
closure(5, sub_atom).
closure(N, C) :- integer(N), N > 5, C = call.
closure(^, true).
closure(//, []).

print_admitted(M, N, A, Head) :-
    (   predicate_property(M:Head, imported_from(From)) -> true ; From = system ),
    (   predicate_property(M:Head, meta_predicate(Spec))
    ->  Spec =.. [_|Specs]
    ;   length(Specs, A), maplist(=(?), Specs)
    ),
    Head =.. [_|Args],
    maplist(kind_letter, Specs, Args, Kinds),
    atomic_list_concat(Kinds, ' ', KindText),
    format("~q/~w\t~w\t~w~n", [N, A, From, KindText]).

%   An argument admitted as the goal `true` is taken as a goal (m0) too.
kind_letter(Spec, Arg, K) :-
    (   closure(Spec, _), Spec \== (?)
    ->  format(atom(K), 'm~w', [Spec])
    ;   Arg == true
    ->  K = m0
    ;   K = a
    ).
