/*  COD SKB: application namespaces, untrusted code, limited queries.
*/

:- module(cod_apps,
          [ app_module/2,          % +App, -Module
            drop_app/1,            % +App
            add_facts/3,           % +App, +Texts, -Count
            remove_facts/3,        % +App, +PatternText, -Count
            add_procedure/3,       % +App, +Text, -PIs
            list_facts/3,          % +App, +PredicateOrAll, -Texts
            run_query/4,           % +App, +Text, +Options, -Answer
            register_library/1,    % +Module
            detach_standard_streams/2, % -In, -Out
            parse_terms/4,         % +Module, +Text, -TermsWithBindings, +Options
            app/2                  % ?App, ?Module
          ]).
:- use_module(library(sandbox)).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- use_module(cod_limits).
:- use_module(cod_sys).

/** <module> Application namespaces of the COD SKB

Every application gets its own Prolog module, `app_<name>`.  It imports the
system-level predicates (cod_sys), the stored procedures of the SKB's
library (stored_procedures/) and the ISO/SWI built-ins, and nothing else:
in particular not `user`, and not any other application's module.

Everything an application sends is untrusted:

  1. Facts and clause heads may not define a built-in, a system-level or a
     library predicate (permission_error(modify, static_procedure, PI)).
  2. Clause bodies and query goals may not be module-qualified and may not
     change the clause database (assert, retract...): an application
     changes its facts through add_facts/3 and remove_facts/3 only.
  3. Clause bodies and query goals must pass library(sandbox)'s safe_goal/1,
     which walks the whole call graph against its white lists.
  4. Queries run under a wall-clock time limit, an inference limit and the
     engine's stack limit, with user_input/user_output/user_error bound to
     empty streams so that no output reaches the protocol channel.
*/

:- dynamic
    app/2,              % App, Module
    library_module/1,   % Module
    pending_declaration/2, % Module, PI: declared while checking a procedure
    safe_cache/2,       % Hash, Module: variant_sha1 of a goal found safe in Module
    safe_cache_size/2.  % Module, Count

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
    atom_concat(app_, App, Module),
    create_app_module(Module),
    assertz(app(App, Module)).

valid_app_name(App) :-
    atom_codes(App, [C0|Cs]),
    code_type(C0, lower),
    length(Cs, N), N < 64,
    forall(member(C, Cs), app_name_code(C)).

app_name_code(C) :- code_type(C, lower), !.
app_name_code(C) :- code_type(C, digit), !.
app_name_code(0'_).

create_app_module(M) :-
    add_import_module(M, cod_sys, end),
    forall(library_module(L), add_import_module(M, L, end)),
    forall(app_library(L), @(use_module(library(L)), M)),
    add_import_module(M, system, end),
    (   import_module(M, user)
    ->  delete_import_module(M, user)
    ;   true
    ).

%   The libraries of SWI-Prolog whose exports every application sees.
%   Nothing is autoloaded for applications (the server turns autoloading
%   off once it has started): what they may call is exactly this, the
%   system predicates, cod_sys and the SKB's stored procedures.
app_library(lists).
app_library(apply).
app_library(aggregate).
app_library(pairs).

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

%!  drop_app(+App) is det.
%
%   Forget every fact and procedure of App.  The module stays (SWI-Prolog
%   cannot delete modules) but is emptied and reused if App comes back.
drop_app(App) :-
    (   app(App, M)
    ->  forall(( current_predicate(M:Name/Arity),
                 functor(H, Name, Arity),
                 \+ predicate_property(M:H, imported_from(_)) ),
               abolish(M:Name/Arity)),
        forget_safe_goals(M)
    ;   true
    ).

		 /*******************************
		 *            FACTS             *
		 *******************************/

%!  add_facts(+App, +Texts:list(string), -Count) is det.
%
%   Add a batch of facts, all or nothing.  Count is the number of facts
%   that were new (a fact already present is not added twice).
%   @error syntax_error(...) with the index of the offending text.
add_facts(App, Texts, Count) :-
    must_be(list, Texts),
    app_module(App, M),
    foldl(parse_fact(M), Texts, Facts, 0, _),
    check_fact_heads(M, Facts),
    foldl(add_fact(M), Facts, 0, Count).

%   Heads are checked once per predicate: a batch usually holds many
%   facts of few predicates.
check_fact_heads(M, Facts) :-
    foldl(fact_indicator, Facts, Keys, 0, _),
    sort(1, @<, Keys, Unique),
    forall(member(_-(I-Fact), Unique),
           catch(check_head(M, Fact), error(E, _), throw(error(E, fact(I, Fact))))).

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
    check_fact(M, Fact).

check_fact(_, Fact) :-
    var(Fact), !,
    instantiation_error(Fact).
check_fact(_, (H:-B)) :- !,
    domain_error(fact, (H:-B)).
check_fact(_, (H-->B)) :- !,
    domain_error(fact, (H-->B)).
check_fact(_, (:-D)) :- !,
    permission_error(execute, directive, D).
check_fact(_, Fact) :-
    \+ ground(Fact), !,
    domain_error(ground_fact, Fact).
check_fact(_, Fact) :-
    compound(Fact),
    compound_name_arity(Fact, Name, Arity),
    operator_functor(Name, Arity), !,
    domain_error(operator_fact, Fact).
check_fact(_, _).

add_fact(M, Fact, N0, N) :-
    (   fact_present(M, Fact)
    ->  N = N0
    ;   assertz(M:Fact),
        N is N0 + 1
    ).

fact_present(M, Fact) :-
    copy_term(Fact, Probe),
    clause(M:Probe, true, Ref),
    clause(M:Stored, true, Ref),
    Stored =@= Fact,
    !.

%!  remove_facts(+App, +PatternText, -Count) is det.
%
%   Retract every fact (clause with body `true`) of App unifying with the
%   pattern.  Procedures are removed by add_procedure/3 redefinition.
remove_facts(App, Text, Count) :-
    app_module(App, M),
    parse_terms(M, Text, Terms, []),
    (   Terms = [Pattern-_]
    ->  true
    ;   domain_error(single_pattern, Text)
    ),
    must_be(callable, Pattern),
    check_head(M, Pattern),
    (   predicate_property(M:Pattern, dynamic)
    ->  aggregate_all(count, retract(M:Pattern), Count)
    ;   Count = 0
    ),
    forget_safe_goals(M).

%!  list_facts(+App, +Predicate, -Texts) is det.
%
%   Texts are the clauses of App (all, or of Name or Name/Arity) in
%   canonical quoted form.
list_facts(App, Pred, Texts) :-
    app_module(App, M),
    findall(Text,
            ( current_predicate(M:Name/Arity),
              pred_selected(Pred, Name, Arity),
              functor(H, Name, Arity),
              \+ predicate_property(M:H, imported_from(_)),
              clause(M:H, B),
              clause_text(H, B, Text)
            ),
            Texts).

pred_selected(all, _, _) :- !.
pred_selected(Name/Arity, Name, Arity) :- !.
pred_selected(Name, Name, _).

clause_text(H, true, Text) :- !,
    format(string(Text), '~k', [H]).
clause_text(H, B, Text) :-
    format(string(Text), '~k', [(H:-B)]).

		 /*******************************
		 *          PROCEDURES          *
		 *******************************/

%!  add_procedure(+App, +Text, -PIs) is det.
%
%   Add one or more clauses.  Every predicate defined in Text replaces
%   any previous definition of that predicate in App (so a client that
%   sends its cost function again does not get duplicate answers).
%   All or nothing: if any clause is rejected, nothing changes.
add_procedure(App, Text, PIs) :-
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
    % Heads first, so that clauses may call one another.  Predicates
    % declared only for the check are recorded in pending_declaration/2,
    % which survives the exception that undoes bindings.
    retractall(pending_declaration(M, _)),
    catch(check_clause_bodies(M, PIs, Clauses),
          Error,
          ( undo_declarations(M), throw(Error) )),
    retractall(pending_declaration(M, _)),
    forall(member(Name/Arity, PIs),
           ( functor(G, Name, Arity), retractall(M:G) )),
    forall(member(H-B, Clauses), assertz(M:(H:-B))),
    forget_safe_goals(M).

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

declare_pending(M, PI) :-
    dynamic(M:PI),
    assertz(pending_declaration(M, PI)).

check_body(M, _H-Body) :-
    check_code_terms(Body),
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
        \+ pending_declaration(M, Name/Arity)
    ->  declare_pending(M, Name/Arity),
        check_safe(M, Goal)
    ;   throw(Error)
    ).

undo_declarations(M) :-
    forall(retract(pending_declaration(M, PI)), abolish(M:PI)).

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

%!  check_code_terms(+Goal) is det.
%
%   Reject, anywhere in Goal, module qualification and database changes.
%   Checked on the whole term (not only on goal positions), so that a
%   goal built at run time cannot smuggle them past the sandbox either.
check_code_terms(Goal) :-
    (   sub_term(T, Goal),
        compound(T),
        compound_name_arity(T, Name, Arity),
        forbidden_in_code(Name, Arity, What)
    ->  permission_error(call, What, Name/Arity)
    ;   true
    ).

forbidden_in_code(:, 2, module_qualified).
forbidden_in_code(@, 2, module_qualified).
forbidden_in_code(Name, Arity, database_change) :-
    db_changing(Name, Arity).

db_changing(assert, 1).
db_changing(asserta, 1).
db_changing(assertz, 1).
db_changing(assert, 2).
db_changing(asserta, 2).
db_changing(assertz, 2).
db_changing(retract, 1).
db_changing(retractall, 1).
db_changing(abolish, 1).
db_changing(abolish, 2).
db_changing(erase, 1).
db_changing(recorda, _).
db_changing(recordz, _).
db_changing(flag, 3).
db_changing(dynamic, _).
db_changing(table, _).

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
%   list of Name=Value lists.  Options:
%
%     - all(Bool): all solutions (default) or the first one only
%     - max_solutions(N): at most N solutions (Truncated tells if cut)
%     - time_limit(Seconds), inference_limit(N)
run_query(App, Text, Options, answer(Solutions, Truncated, Us)) :-
    app_module(App, M),
    parse_terms(M, Text, Terms, []),
    (   Terms = [Goal-Bindings]
    ->  true
    ;   Terms == []
    ->  domain_error(goal, Text)
    ;   domain_error(single_goal, Text)
    ),
    must_be(callable, Goal),
    check_query_goal(M, Goal),
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
    ;   check_code_terms(Goal),
        safe_goal(M:Goal),
        remember_safe_goal(Hash, M)
    ).

%   The cache of goals found safe is keyed by the goal's variant hash (so a
%   lookup is one indexed clause access) and bounded per application: an
%   application sending ever new goals only refills it.
remember_safe_goal(Hash, M) :-
    (   retract(safe_cache_size(M, N0)) -> true ; N0 = 0 ),
    (   N0 >= 10000
    ->  retractall(safe_cache(_, M)), N = 1
    ;   N is N0 + 1
    ),
    assertz(safe_cache_size(M, N)),
    assertz(safe_cache(Hash, M)).

forget_safe_goals(M) :-
    retractall(safe_cache(_, M)),
    retractall(safe_cache_size(M, _)).

%   limited(+App, :Runner, +Seconds, +Inferences)
%   Run with the limits, on behalf of App (see current_app/1).  The
%   standard streams are detached from the protocol once and for all by
%   detach_standard_streams/2, so no per-query stream juggling is needed.
limited(App, Runner, Time, Inf) :-
    setup_call_cleanup(
        b_setval(cod_app, App),
        run_limits(Runner, Time, Inf),
        nb_setval(cod_app, [])).

%!  detach_standard_streams(-ProtocolIn, -ProtocolOut) is det.
%
%   Bind user_input, user_output and the current streams to an empty
%   input and a null output, and return the real standard streams for the
%   protocol alone.  Whatever application code reads or writes can then
%   never reach the protocol channel.
detach_standard_streams(In, Out) :-
    stream_property(In, alias(user_input)),
    stream_property(Out, alias(user_output)),
    open_string("", NullIn),
    open_null_stream(NullOut),
    set_stream(NullIn, alias(user_input)),
    set_stream(NullOut, alias(user_output)),
    set_stream(NullOut, alias(user_error)),
    set_input(NullIn),
    set_output(NullOut).

run_limits(Runner, Time, Inf) :-
    run_limited(Runner, Time, Inf).
