/*  COD SKB: application namespaces, the bookkeeping of what each holds, and the rules of its heads.
*/

:- module(cod_namespaces,
          [ app_module/2,          % +App, -Module
            existing_app_module/2, % +App, -Module
            valid_app_name/1,      % +App
            app/2,                 % ?App, ?Module
            app_libraries/1,       % -Module
            register_library/1,    % +Module
            library_module/1,      % ?Module
            fact_owner/2,          % ?ClauseRef, ?Owner
            fact_chars/2,          % ?ClauseRef, ?Characters
            procedure/4,           % ?Module, ?Name/Arity, ?Persistent, ?Characters
            fact_ref/2,            % +Module, -ClauseRef
            clause_module/2,       % +ClauseRef, -Module
            fact_predicate/2,      % +Module, +Name/Arity
            empty_app/2,           % ?App, ?Module
            destroy_app/2,         % +App, +Module
            add_usage/5,           % +Module, +Facts, +FactChars, +Clauses, +ClauseChars
            app_usage/2,           % +App, -Usage
            check_limits/2,        % +Module, +Limits
            check_head/2,          % +Module, +Head
            operator_functor/2,    % +Name, +Arity
            with_declarations/1,   % :Goal
            declare_pending/2,     % +Module, +PI
            note_declaration/2,    % +Module, +PI
            pending_declarations/1, % -List
            forget_declarations/0,
            undo_declarations/0,
            safe_goal_known/2,     % +Hash, +Module
            remember_safe_goal/2,  % +Hash, +Module
            forget_safe_goals/1    % +Module
          ]).
:- use_module(library(sandbox)).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- use_module(library(pairs)).
:- use_module(cod_sys).

/** <module> Application namespaces of the COD SKB

Every application gets its own Prolog module, `'app_'+Name`.  It imports
the system-level predicates (cod_sys), the stored procedures of the SKB's
library (stored_procedures/), the exports of a few SWI-Prolog libraries
(app_library/1) and the ISO/SWI built-ins, and nothing else: in particular
not `user`, and not any other application's module.

This module keeps what every other part of cod_apps reads and writes about
a namespace: which applications exist (app/2), the facts' owners and sizes
(fact_owner/2, fact_chars/2), the procedures (procedure/4), the usage
counted against quotas (usage/5), the predicates a write declared (undone
with it: with_declarations/1), the goals found safe (a cache), and which
heads an application may define (check_head/2).
*/

:- dynamic
    app/2,                 % App, Module
    library_module/1,      % Module
    safe_cache/2,          % Hash, Module: variant_sha1 of a goal found safe in Module
    safe_cache_size/2,     % Module, Count
    fact_owner/2,          % ClauseRef, Owner
    fact_chars/2,          % ClauseRef, Characters of the fact's text
    procedure/4,           % Module, Name/Arity, Persistent, Characters
    usage/5.               % Module, Facts, FactChars, Clauses, ClauseChars

%!  app_module(+App, -Module) is det.
%
%   Module is the namespace of application App, created on first use.
%   @error domain_error(cod_app_name, App) if App is not a valid name.
app_module(App, Module) :-
    app(App, Module0), !,
    Module = Module0.
app_module(App, Module) :-
    must_be(atom, App),
    (   valid_app_name(App)
    ->  true
    ;   domain_error(cod_app_name, App)
    ),
    with_mutex(cod_apps, create_app(App, Module)).

create_app(App, Module) :-
    app(App, Module), !.
create_app(App, Module) :-
    atom_concat(app_, App, Module),
    create_app_module(Module),
    assertz(usage(Module, 0, 0, 0, 0)),
    assertz(app(App, Module)).

%!  existing_app_module(+App, -Module) is semidet.
existing_app_module(App, Module) :-
    app(App, Module).

%!  valid_app_name(@App) is semidet.
%
%   An application name is 1..128 bytes of printable UTF-8 (no control
%   characters).  The module is 'app_' followed by the name: names never
%   collide, whatever characters they hold.  Deliberately the wire's rule
%   (cod.protocol.names), no stricter: which names would pass for another
%   (NFC, invisible characters, scripts, look-alikes of names in use) is the
%   daemon's to refuse (rm/names.py, rm/confusables.py), where the names in
%   use are known.
valid_app_name(App) :-
    atom(App),
    atom_codes(App, Codes),
    Codes \== [],
    utf8_length(Codes, 0, Bytes),
    Bytes =< 128,
    forall(member(C, Codes), printable_code(C)).

utf8_length([], N, N).
utf8_length([C|Cs], N0, N) :-
    (   C < 0x80 -> N1 is N0 + 1
    ;   C < 0x800 -> N1 is N0 + 2
    ;   C < 0x10000 -> N1 is N0 + 3
    ;   N1 is N0 + 4
    ),
    utf8_length(Cs, N1, N).

printable_code(C) :-                  % as cod.protocol.names
    C >= 0x20, C =\= 0x7f,
    \+ between(0x80, 0x9f, C),
    \+ between(0xd800, 0xdfff, C),
    C =\= 0x2028, C =\= 0x2029.

create_app_module(M) :-
    inherits_from(M, cod_sys), !.     % left by a write that was undone
create_app_module(M) :-
    set_module(M:class(temporary)),   % so that destroy_app/2 can free it
    app_libraries(Libs),
    add_import_module(M, Libs, end),
    add_import_module(M, cod_sys, end),
    forall(library_module(L), add_import_module(M, L, end)),
    add_import_module(M, system, end),
    (   import_module(M, user)
    ->  delete_import_module(M, user)
    ;   true
    ).

%   inherits_from(+M, +Super): Super is one of M's import modules
%   (import_module/2 called with both bound looks at the first one only).
inherits_from(M, Super) :-
    import_module(M, S),
    S == Super, !.

%   The libraries of SWI-Prolog whose exports every application sees.
%   Nothing is autoloaded for applications (the server turns autoloading
%   off once it has started): what they may call is exactly this, the
%   system predicates, cod_sys and the SKB's stored procedures.
app_library(lists).
app_library(apply).
app_library(aggregate).
app_library(pairs).
app_library(clpfd).     % the paper's SKB was a CLP engine; clpfd declares itself sandbox-safe

%!  app_libraries(-Module) is det.
%
%   Module, cod_app_libraries, imports the exports of every app_library/1
%   (predicates and operators) and inherits from nothing; every
%   application's module inherits from it first, so the libraries'
%   predicates come before cod_sys, the stored procedures and the
%   built-ins, as when each application imported them itself.  Importing
%   them into each new module (use_module/1, five libraries) cost ~190 us
%   of CPU per application; inheriting costs ~2 us (docs/design-rm.md,
%   "Listing 1 after issue 31's client round").  The predicates an
%   application sees are the same: predicate_property/2 still says
%   imported_from(Library), so check_head/2 refuses to redefine them, and
%   library(sandbox) checks them as before.
app_libraries(Libs) :-
    Libs = cod_app_libraries,
    (   current_prolog_flag(cod_app_libraries, true)   % a flag: not undone with a transaction
    ->  true
    ;   with_mutex(cod_app_libraries, make_app_libraries(Libs))
    ).

make_app_libraries(_) :-
    current_prolog_flag(cod_app_libraries, true), !.
make_app_libraries(Libs) :-
    forall(app_library(L), @(use_module(library(L)), Libs)),
    forall(import_module(Libs, Super), delete_import_module(Libs, Super)),
    create_prolog_flag(cod_app_libraries, true, [keep(false)]).

%!  register_library(+Module) is det.
%
%   Make the exported predicates of Module (a trusted file loaded from
%   stored_procedures/) visible to and callable by every application.
%   They are declared safe for the sandbox: they are reviewed code, and
%   whatever application code they call was checked when it was added.
register_library(Module) :-
    (   library_module(Module)
    ->  true
    ;   assertz(library_module(Module))
    ),
    forall(app(_, M),
           (   import_module(M, Module)
           ->  true
           ;   delete_import_module(M, system),
               add_import_module(M, Module, end),
               add_import_module(M, system, end)
           )),
    retractall(safe_cache(_, _)),
    retractall(safe_cache_size(_, _)).

:- multifile sandbox:safe_primitive/1.

% The SKB's own system predicates only read facts; library procedures are
% trusted (see register_library/1).  The clause is written as
% sandbox:(Head :- Body) on purpose: library(sandbox) verifies literal
% safe_primitive/1 declarations at load time, and these need to be
% computed from the registered modules at run time.
sandbox:(safe_primitive(Goal) :- cod_namespaces:trusted_primitive(Goal)).

trusted_primitive(cod_sys:Head) :-
    exported_head(cod_sys, Head),
    functor(Head, Name, _),
    \+ sub_atom(Name, 0, _, _, cod_sys_).
trusted_primitive(Module:Head) :-
    library_module(Module),
    exported_head(Module, Head).

exported_head(Module, Head) :-
    module_property(Module, exports(PIs)),
    (   nonvar(Head)
    ->  functor(Head, Name, Arity),
        memberchk(Name/Arity, PIs)
    ;   member(Name/Arity, PIs),
        functor(Head, Name, Arity)
    ).

clause_module(Ref, M) :-
    clause_property(Ref, module(M)).

fact_ref(M, Ref) :-
    fact_chars(Ref, _),
    clause_module(Ref, M).

%!  empty_app(?App, ?Module) is nondet.
%
%   App holds no fact and no procedure: its module may be destroyed.
empty_app(App, M) :-
    app(App, M),
    usage(M, 0, _, 0, _).

%!  destroy_app(+App, +Module) is det.
%
%   Forget App and free its module.  Not inside a transaction (a module
%   is not transactional data), and only while no thread runs code of
%   App (the server checks both).
destroy_app(App, M) :-
    forall(( current_predicate(M:Name/Arity),
             functor(H, Name, Arity),
             \+ predicate_property(M:H, imported_from(_)) ),
           abolish(M:Name/Arity)),
    retractall(usage(M, _, _, _, _)),
    retractall(procedure(M, _, _, _)),
    retractall(app(App, M)),
    forget_safe_goals(M),
    catch('$destroy_module'(M), _, true).

add_usage(M, DF, DFC, DC, DCC) :-
    retract(usage(M, F0, FC0, C0, CC0)),
    F is F0 + DF, FC is FC0 + DFC, C is C0 + DC, CC is CC0 + DCC,
    assertz(usage(M, F, FC, C, CC)).

%!  app_usage(+App, -Usage) is det.
%
%   Usage is usage(Facts, FactChars, Clauses, ClauseChars).
app_usage(App, usage(F, FC, C, CC)) :-
    (   app(App, M), usage(M, F, FC, C, CC)
    ->  true
    ;   F = 0, FC = 0, C = 0, CC = 0
    ).

check_limits(_, none) :- !.
check_limits(M, limits(MaxF, MaxFC, MaxC, MaxCC)) :-
    usage(M, F, FC, C, CC),
    over(F, MaxF, facts),
    over(FC, MaxFC, fact_chars),
    over(C, MaxC, clauses),
    over(CC, MaxCC, clause_chars).

over(Value, Max, What) :-
    (   Value > Max
    ->  throw(error(resource_error(cod_quota(What, Max)), usage(What, Value)))
    ;   true
    ).

%   A predicate holding facts is not redefined by a procedure (and a
%   procedure's predicate is not extended by facts: check_head/2).
fact_predicate(M, Name/Arity) :-
    functor(H, Name, Arity),
    predicate_property(M:H, dynamic),
    clause(M:H, true, Ref),
    fact_chars(Ref, _),
    !.

%!  with_declarations(:Goal) is semidet.
%
%   Run a write that may add procedures: declarations it made are kept
%   when it succeeds and undone when it fails or throws.
:- meta_predicate with_declarations(0).
with_declarations(Goal) :-
    forget_declarations,
    catch(Goal, E, true),
    (   var(E)
    ->  forget_declarations
    ;   undo_declarations,
        throw(E)
    ).

declare_pending(M, PI) :-
    dynamic(M:PI),
    note_declaration(M, PI).

%   note_declaration(+M, +PI): PI came into existence in M during this
%   write; undo_declarations/0 abolishes it again if the write is undone
%   (a predicate is not transactional data).
note_declaration(M, PI) :-
    pending_declarations(L0),
    nb_setval(cod_pending, [M:PI|L0]).

%   pending_declarations(-List): M:Name/Arity declared by this thread
%   while checking procedures, since the last forget_declarations/0.
pending_declarations(L) :-
    (   nb_current(cod_pending, L0), is_list(L0) -> L = L0 ; L = [] ).

forget_declarations :-
    nb_setval(cod_pending, []).

%   undo_declarations: abolish what this thread declared for a check
%   that did not lead to a write (unless clauses arrived meanwhile).
undo_declarations :-
    pending_declarations(Pending),
    forget_declarations,
    forall(member(M:Name/Arity, Pending),
           (   functor(H, Name, Arity),
               \+ catch(clause(M:H, _), _, fail)
           ->  abolish(M:Name/Arity)
           ;   true
           )).

%!  check_head(+Module, +Head) is det.
%
%   Head may be defined by the application: not a variable, not
%   module-qualified, not a control construct, built-in, system-level or
%   library predicate.
check_head(_, H) :-
    var(H), !,
    instantiation_error(H).
check_head(_, M:H) :- !,
    permission_error(modify, module, M:H).
check_head(_, H) :-
    \+ callable(H), !,
    type_error(callable, H).
check_head(M, H) :-
    functor(H, Name, Arity),
    (   control_construct(Name, Arity)
    ->  permission_error(modify, static_procedure, Name/Arity)
    ;   predicate_property(system:H, defined)
    ->  permission_error(modify, static_procedure, Name/Arity)
    ;   predicate_property(M:H, imported_from(From))
    ->  permission_error(modify, static_procedure, From:Name/Arity)
    ;   true
    ).

%   operator_functor(+Name, +Arity): a term Name/Arity is what the reader
%   builds from an operator (db-rtime(3000) is -(db, rtime(3000))): never
%   the name a user means for a fact.
operator_functor(Name, 2) :-
    current_op(_, Type, Name),
    memberchk(Type, [xfx, xfy, yfx]), !.
operator_functor(Name, 1) :-
    current_op(_, Type, Name),
    memberchk(Type, [fy, fx, xf, yf]), !.

control_construct(',', 2).
control_construct(';', 2).
control_construct('->', 2).
control_construct('*->', 2).
control_construct('|', 2).
control_construct(:-, 1).
control_construct(:-, 2).
control_construct(?-, 1).

%   The cache of goals found safe is keyed by the goal's variant hash (so a
%   lookup is one indexed clause access) and bounded per application: an
%   application sending ever new goals only refills it.
remember_safe_goal(Hash, M) :-
    with_mutex(cod_safe_cache,
               (   (   retract(safe_cache_size(M, N0)) -> true ; N0 = 0 ),
                   (   N0 >= 10000
                   ->  retractall(safe_cache(_, M)), N = 1
                   ;   N is N0 + 1
                   ),
                   assertz(safe_cache_size(M, N)),
                   assertz(safe_cache(Hash, M))
               )).

%   safe_goal_known(+Hash, +M): the goal of variant hash Hash was found safe in M since M last changed.
safe_goal_known(Hash, M) :-
    safe_cache(Hash, M).

forget_safe_goals(M) :-
    retractall(safe_cache(_, M)),
    retractall(safe_cache_size(M, _)).

% The libraries' module is made while the server loads, outside any write's transaction.
:- initialization(app_libraries(_)).

