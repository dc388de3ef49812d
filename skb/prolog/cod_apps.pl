/*  COD SKB: application namespaces, untrusted code, limited queries.
*/

:- module(cod_apps,
          [ app_module/2,          % +App, -Module
            existing_app_module/2, % +App, -Module
            valid_app_name/1,      % +App
            drop_owner/3,          % +App, +Owner, -Count
            release_app/1,         % +App
            drop_app/1,            % +App
            empty_app/2,           % ?App, ?Module
            destroy_app/2,         % +App, +Module
            add_facts/5,           % +App, +Owner, +Texts, +Limits, -Count
            remove_facts/3,        % +App, +PatternTexts, -Count
            add_procedure/5,       % +App, +Text, +Persistent, +Limits, -PIs
            app_usage/2,           % +App, -Usage
            list_facts/3,          % +App, +PredicateOrAll, -Texts
            list_procedures/2,     % +App, -Texts
            describe_app/3,        % +App, -Procedures, -FactCounts
            run_query/4,           % +App, +Text, +Options, -Answer
            evaluate/5,            % +App, +Staged, +Queries, +Options, -Results
            with_declarations/1,   % :Goal
            app_snapshot/2,        % -App, -State
            restore_app/2,         % +App, +State
            register_library/1,    % +Module
            library_module/1,      % ?Module
            parse_terms/4,         % +Module, +Text, -TermsWithBindings, +Options
            app/2                  % ?App, ?Module
          ]).
:- use_module(library(sandbox)).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- use_module(library(occurs)).
:- use_module(library(pairs)).
:- use_module(cod_limits).
:- use_module(cod_sys).

/** <module> Application namespaces of the COD SKB

Every application gets its own Prolog module, `'app_'+Name`.  It imports
the system-level predicates (cod_sys), the stored procedures of the SKB's
library (stored_procedures/), the exports of a few SWI-Prolog libraries
(app_library/1) and the ISO/SWI built-ins, and nothing else: in particular
not `user`, and not any other application's module.

Everything an application sends is untrusted:

  1. Facts must be ground and named by a word; facts and clause heads may
     not define a built-in, a system-level or a library predicate
     (permission_error(modify, static_procedure, PI)).
  2. Clause bodies and query goals may not be module-qualified in a goal
     position, and must pass library(sandbox)'s safe_goal/1 with the deny
     layer of cod_guard.pl in front of it.
  3. Queries run under a wall-clock time limit and an inference limit that
     they cannot catch (cod_limits.pl), the thread's stack limit, inside a
     snapshot/1 (so they see a consistent database while the Resource
     Manager writes), with the standard streams bound to empty streams.
  4. Facts and clauses are counted per application (usage/5), and an add
     that would pass the limits the caller gives is refused whole.

Facts remember who added them (fact_owner/2): a connection of the
application (`conn(Id)`) or `persistent`.  drop_owner/3 removes exactly
the facts a leaving connection added and nobody else holds; release_app/1
removes what is left but persistent facts and procedures when the
application's last connection leaves, and frees the module when nothing
is left.

All writers run in the SKB server's writer thread, each inside a
transaction/1 (see cod_server.pl): an exception anywhere undoes the whole
operation.
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

		 /*******************************
		 *           MODULES            *
		 *******************************/

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
sandbox:(safe_primitive(Goal) :- cod_apps:trusted_primitive(Goal)).

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

		 /*******************************
		 *      OWNERS AND RELEASE      *
		 *******************************/

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

clause_module(Ref, M) :-
    clause_property(Ref, module(M)).

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

fact_ref(M, Ref) :-
    fact_chars(Ref, _),
    clause_module(Ref, M).

		 /*******************************
		 *            FACTS             *
		 *******************************/

%!  add_facts(+App, +Owner, +Texts:list(string), +Limits, -Count) is det.
%
%   Add a batch of facts held by Owner (conn(Id) or persistent), all or
%   nothing.  Count is the number of facts that were new; a fact already
%   present is not added twice but gets Owner as one more holder.  Limits
%   is limits(MaxFacts, MaxFactChars, MaxClauses, MaxClauseChars) or
%   `none`.
%
%   @error syntax_error(...) with the index of the offending text.
%   @error resource_error(cod_quota(What, Limit)) when the batch would
%          pass a limit.
add_facts(App, Owner, Texts, Limits, Count) :-
    must_be(list, Texts),
    must_be(ground, Owner),
    app_module(App, M),
    foldl(parse_fact(M), Texts, Facts, 0, _),
    check_fact_heads(M, Facts),
    foldl(add_fact(M, Owner), Facts, Texts, 0-0, Count-Chars),
    add_usage(M, Count, Chars, 0, 0),
    check_limits(M, Limits),
    (   Count > 0 -> forget_safe_goals(M) ; true ).

%   Heads are checked once per predicate: a batch usually holds many
%   facts of few predicates.
check_fact_heads(M, Facts) :-
    foldl(fact_indicator, Facts, Keys, 0, _),
    sort(1, @<, Keys, Unique),
    forall(member(_-(I-Fact), Unique),
           catch(check_fact_head(M, Fact), error(E, _), throw(error(E, fact(I, Fact))))).

check_fact_head(M, Fact) :-
    check_head(M, Fact),
    functor(Fact, Name, Arity),
    (   procedure(M, Name/Arity, _, _)
    ->  permission_error(modify, procedure, Name/Arity)
    ;   true
    ).

fact_indicator(Fact, PI-(I-Fact), I, I1) :-
    I1 is I + 1,
    (   callable(Fact), Fact \= _:_
    ->  functor(Fact, Name, Arity), PI = Name/Arity
    ;   PI = '$bad'(I)
    ).

parse_fact(M, Text, Fact, I0, I) :-
    I is I0 + 1,
    catch(parse_terms(M, Text, Terms, []),
          error(E, Ctx),
          throw(error(E, fact(I0, Ctx)))),
    (   Terms = [Fact-_]
    ->  true
    ;   Terms == []
    ->  throw(error(syntax_error(end_of_file), fact(I0, Text)))
    ;   throw(error(domain_error(single_fact, Text), fact(I0, Text)))
    ),
    catch(check_fact(Fact), error(E2, _), throw(error(E2, fact(I0, Text)))).

check_fact(Fact) :-
    var(Fact), !,
    instantiation_error(Fact).
check_fact((H:-B)) :- !,
    domain_error(fact, (H:-B)).
check_fact((H-->B)) :- !,
    domain_error(fact, (H-->B)).
check_fact((:-D)) :- !,
    permission_error(execute, directive, D).
check_fact(Fact) :-
    \+ ground(Fact), !,
    domain_error(ground_fact, Fact).
check_fact(Fact) :-
    compound(Fact),
    compound_name_arity(Fact, Name, Arity),
    operator_functor(Name, Arity), !,
    domain_error(operator_fact, Fact).
check_fact(_).

add_fact(M, Owner, Fact, Text, N0-C0, N-C) :-
    (   fact_present(M, Fact, Ref)
    ->  (   fact_owner(Ref, Owner) -> true ; assertz(fact_owner(Ref, Owner)) ),
        N = N0, C = C0
    ;   (   predicate_property(M:Fact, defined)
        ->  true
        ;   functor(Fact, Name, Arity),   % a new predicate: undone with the write
            note_declaration(M, Name/Arity)
        ),
        assertz(M:Fact, Ref),
        string_length(Text, Len),
        assertz(fact_owner(Ref, Owner)),
        assertz(fact_chars(Ref, Len)),
        N is N0 + 1,
        C is C0 + Len
    ).

fact_present(M, Fact, Ref) :-
    copy_term(Fact, Probe),
    predicate_property(M:Probe, dynamic),
    clause(M:Probe, true, Ref),
    clause(M:Stored, true, Ref),
    Stored =@= Fact,
    !.

erase_fact(M, Ref) :-
    (   retract(fact_chars(Ref, Len)) -> true ; Len = 0 ),
    retractall(fact_owner(Ref, _)),
    erase(Ref),
    add_usage(M, -1, -Len, 0, 0).

%!  remove_facts(+App, +PatternTexts, -Count) is det.
%
%   Remove every fact of App unifying with one of the patterns, whoever
%   added it (as retract/1 would).  Procedures are not facts: they are
%   replaced by add_procedure/5.
remove_facts(App, Patterns, Count) :-
    must_be(list, Patterns),
    app_module(App, M),
    maplist(parse_pattern(M), Patterns, Heads),
    foldl(remove_matching(M), Heads, 0, Count),
    (   Count > 0 -> forget_safe_goals(M) ; true ).

parse_pattern(M, Text, Pattern) :-
    parse_terms(M, Text, Terms, []),
    (   Terms = [Pattern-_]
    ->  true
    ;   domain_error(single_pattern, Text)
    ),
    must_be(callable, Pattern),
    check_head(M, Pattern).

remove_matching(M, Pattern, N0, N) :-
    (   predicate_property(M:Pattern, dynamic)
    ->  findall(Ref, ( clause(M:Pattern, true, Ref), fact_chars(Ref, _) ), Refs),
        forall(member(Ref, Refs), erase_fact(M, Ref)),
        length(Refs, K),
        N is N0 + K
    ;   N = N0
    ).

%!  list_facts(+App, +Predicate, -Texts) is det.
%
%   Texts are the facts of App (all, or of Name or Name/Arity) in
%   canonical quoted form.
list_facts(App, Pred, Texts) :-
    (   app(App, M)
    ->  findall(Text,
                ( fact_ref(M, Ref),
                  clause(M:H, true, Ref),
                  functor(H, Name, Arity),
                  pred_selected(Pred, Name, Arity),
                  format(string(Text), '~k', [H])
                ),
                Texts)
    ;   Texts = []
    ).

pred_selected(all, _, _) :- !.
pred_selected(Name/Arity, Name, Arity) :- !.
pred_selected(Name, Name, _).

		 /*******************************
		 *            USAGE             *
		 *******************************/

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

		 /*******************************
		 *          PROCEDURES          *
		 *******************************/

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

%   A predicate holding facts is not redefined by a procedure (and a
%   procedure's predicate is not extended by facts: check_head/2).
fact_predicate(M, Name/Arity) :-
    functor(H, Name, Arity),
    predicate_property(M:H, dynamic),
    clause(M:H, true, Ref),
    fact_chars(Ref, _),
    !.

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

check_body(M, _H-Body) :-
    check_goal_qualification(M, Body),
    check_safe(M, Body).

%   check_safe(+M, +Goal)
%   Run the sandbox.  A call to a not-yet-defined predicate of the
%   application's own module is not a safety issue: declare it (dynamic,
%   no clauses) and check again, so the rest of the body is still checked.
check_safe(M, Goal) :-
    catch(safe_goal(M:Goal), Error, true),
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

		 /*******************************
		 *           PARSING            *
		 *******************************/

%!  parse_terms(+Module, +Text, -Terms, +Options) is det.
%
%   Read all terms of Text (operators of Module), each as Term-Bindings.
%   A text whose last term lacks its full stop gets one.
%   @error syntax_error(Message) with context text_position(Line, Column).
parse_terms(M, Text, Terms, _Options) :-
    must_be(text, Text),
    string_concat(Text, "\n.", Closed0),
    (   ends_with_full_stop(Text)
    ->  Closed = Text
    ;   Closed = Closed0
    ),
    setup_call_cleanup(
        open_string(Closed, S),
        read_all(S, M, Terms),
        close(S)).

ends_with_full_stop(Text) :-
    split_string(Text, "", " \t\r\n", [Trimmed]),
    (   Trimmed == ""
    ->  true
    ;   sub_string(Trimmed, _, 1, 0, ".")
    ).

read_all(S, M, Terms) :-
    catch(read_term(S, T, [ variable_names(Vs), module(M),
                            syntax_errors(error), backquoted_string(false) ]),
          error(syntax_error(E), stream(_, Line, LinePos, _)),
          (   Col is LinePos + 1,
              throw(error(syntax_error(E), text_position(Line, Col)))
          )),
    (   T == end_of_file
    ->  Terms = []
    ;   Terms = [T-Vs|Rest],
        read_all(S, M, Rest)
    ).

		 /*******************************
		 *           QUERIES            *
		 *******************************/

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

check_query_goal(M, Goal) :-
    variant_sha1(Goal, Hash),
    (   safe_cache(Hash, M)
    ->  true
    ;   check_goal_qualification(M, Goal),
        safe_goal(M:Goal),
        remember_safe_goal(Hash, M)
    ).

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

forget_safe_goals(M) :-
    retractall(safe_cache(_, M)),
    retractall(safe_cache_size(M, _)).

%   limited(+App, :Runner, +Seconds, +Inferences)
%   Run with the limits, on behalf of App (see current_app/1), in a
%   snapshot of the database: the query sees one consistent state while
%   the Resource Manager writes, and whatever it might change is dropped.
limited(App, Runner, Time, Inf) :-
    b_setval(cod_app, App),
    snapshot(run_limited(Runner, Time, Inf)).

		 /*******************************
		 *   EVALUATION BEFORE A WRITE  *
		 *******************************/

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

		 /*******************************
		 *     SNAPSHOT AND RESTORE     *
		 *******************************/

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

%!  list_procedures(+App, -Texts) is det.
%
%   The procedures of App, one text per predicate.
list_procedures(App, Texts) :-
    (   app(App, M)
    ->  findall(Text, ( procedure(M, PI, _, _), procedure_text(M, PI, Text) ), Texts)
    ;   Texts = []
    ).

% The libraries' module is made while the server loads, outside any write's transaction.
:- initialization(app_libraries(_)).
