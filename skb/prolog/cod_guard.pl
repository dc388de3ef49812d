/*  COD SKB: what application code may never call, on top of library(sandbox).
*/

:- module(cod_guard,
          [ guard_installed/0,       % is the deny layer ahead of library(sandbox)?
            reserved_exception/1,    % ?Ball
            denied_reason/3,         % +Name, +Arity, -Reason
            argument_refusal/2       % +Goal, -Error
          ]).
:- use_module(cod_format).

/** <module> The deny layer of the COD SKB sandbox

library(sandbox) was written for SWISH, where every query runs in a
thread of its own that dies afterwards.  The SKB is different: every
application shares one engine, the engine's own state and the other
applications' namespaces.  Several of sandbox's white-listed primitives
are therefore unsafe here, and this module takes them back:

  - reflection (clause/2, predicate_property/2, current_predicate/2,
    import_module/2 ...): a head built at run time (`G =.. [:, app_b, P]`)
    reaches another application's namespace, which no static check can see;
  - loading code (use_module/1 accepts relative paths, resolved against the
    daemon's working directory: the loaded file's directives would run
    unsandboxed);
  - global state (Prolog flags, global variables, operators, stack limits,
    tables, the recorded database): one application would change another's
    answers;
  - database changes: an application changes its facts only through
    add_facts/remove_facts, where they are counted against its quota;
  - abort/0, print_message/2, cleanup handlers (they run after the time
    limit has fired and cannot be interrupted), attributes (they name the
    module whose hooks run: another application's code on our data);
  - message translation (message_to_string/2 runs format/3 on the
    message's arguments, outside the checks below), statistics/0,1;
  - tabling, all of it (tabling_goal/1): a tabled goal keeps its tables
    after the query, in memory no limit of the query bounds (~44 MB a
    query), and a limit that stops a tabled goal mid-completion crashed the
    engine with SIGSEGV (issue 47: `tabled_call(length(L, N))`).  Refused
    are calls of a tabled predicate (tabled_call/1, undefined/0, ...), of
    every predicate of the '$tabling' and wfs modules (table/1, abolish_*,
    start_tabling ...), and of tries (trie_*) and the '$tbl_' primitives.

Some goals are allowed only with arguments the check can see when the goal
is checked, before it runs (argument_refusal/2):

  - format/1,2,3: the format string (cod_format.pl: no `~@ ~p ~W`,
    numeric arguments bounded);
  - throw/1: a ball that cannot be a reserved exception (below), so
    `X = '$aborted', throw(X)` is refused as well: an unbound ball could be
    anything at run time;
  - term_string/3: write options from a short list (portray_goal(G) would
    call G);
  - statistics/2: the calling thread's own time and inferences only;
  - current_prolog_flag/2: a named flag, not the engine's command line.

catch/3 and catch_with_backtrace/3 stay allowed, but their catcher must be
bound and must not unify with a reserved exception: the SKB's limits
(cod_limits.pl) throw those, and a query that could catch them could run
for ever.

How: sandbox asks safe_primitive/1 first for every goal in the call graph
of a query or procedure body.  This file adds a clause to that multifile
predicate which *throws* for denied goals, and is loaded before
library(sandbox), so its clause comes first.  guard_installed/0 checks the
order at start-up; the server refuses to run without it.
*/

:- multifile
    sandbox:safe_primitive/1,
    user:message_hook/3.

% Must be the first clause of sandbox:safe_primitive/1: written as
% sandbox:(Head :- Body) because library(sandbox) verifies literal
% declarations when it loads (and would complain about a variable head,
% see the message hook below).
sandbox:(safe_primitive(Goal) :- cod_guard:refuse(Goal)).

% library(sandbox) checks every safe_primitive/1 clause when it loads and
% reports our variable-headed one as a bad declaration: it is intended.
user:message_hook(bad_safe_declaration(Goal, _File, _Line), error, _) :-
    var(Goal).

%!  guard_installed is semidet.
%
%   True if the deny layer runs before any of library(sandbox)'s own
%   white-list entries.
guard_installed :-
    clause(sandbox:safe_primitive(G), Body),
    !,
    var(G),
    Body = cod_guard:refuse(G0),
    G0 == G.

%   refuse(+Goal): throw a permission error if Goal may not be called by
%   application code; fail otherwise (sandbox goes on with its own rules).
refuse(Goal) :-
    var(Goal), !, fail.
refuse(Goal) :-
    strip_module(Goal, M, Plain),
    callable(Plain),
    functor(Plain, Name, Arity),
    (   (   denied_reason(Name, Arity, _)
        ->  true
        ;   tabling_goal(M:Plain)
        )
    ->  throw(error(permission_error(call, sandboxed, Name/Arity),
                    cod_guard(Name/Arity)))
    ;   catch_goal(Name, Arity)
    ->  arg(2, Plain, Catcher),
        check_catcher(Name/Arity, Catcher)
    ;   argument_refusal(Plain, Error)
    ->  throw(Error)
    ).

catch_goal(catch, 3).
catch_goal(catch_with_backtrace, 3).

check_catcher(PI, Catcher) :-
    (   var(Catcher)
    ->  throw(error(permission_error(catch, reserved_exception, Catcher),
                    cod_guard(PI)))
    ;   reserved_exception(Ball),
        \+ Catcher \= Ball
    ->  throw(error(permission_error(catch, reserved_exception, Catcher),
                    cod_guard(PI)))
    ;   fail                        % allowed: sandbox checks the goals
    ).

%!  argument_refusal(+Goal, -Error) is semidet.
%
%   Goal (not module-qualified) may not run as application code with the
%   arguments it has when it is checked: Error says why.
argument_refusal(format(F), E) :-
    format_error(format/1, F, [], E).
argument_refusal(format(F, A), E) :-
    format_error(format/2, F, A, E).
argument_refusal(format(_, F, A), E) :-
    format_error(format/3, F, A, E).
argument_refusal(throw(Ball), error(permission_error(throw, reserved_exception, Ball),
                                    cod_guard(throw/1))) :-
    (   var(Ball)
    ->  true
    ;   reserved_exception(R),
        \+ Ball \= R
    ),
    !.
argument_refusal(term_string(_, _, Options),
                 error(permission_error(call, sandboxed, term_string/3),
                       cod_guard(term_string/3, write_option(O)))) :-
    (   \+ is_list(Options)
    ->  O = Options
    ;   member(O, Options),
        \+ safe_write_option(O)
    ),
    !.
argument_refusal(statistics(Key, _),
                 error(permission_error(call, sandboxed, statistics/2),
                       cod_guard(statistics/2, statistics_key(Key)))) :-
    \+ ( atom(Key), own_statistic(Key) ).
argument_refusal(current_prolog_flag(Flag, _),
                 error(permission_error(call, sandboxed, current_prolog_flag/2),
                       cod_guard(current_prolog_flag/2, prolog_flag(Flag)))) :-
    \+ ( atom(Flag), \+ hidden_flag(Flag) ).

format_error(PI, F, A, error(permission_error(call, sandboxed, PI), cod_guard(PI, Why))) :-
    format_refusal(F, A, Why).

safe_write_option(O) :-
    nonvar(O),
    O =.. [Name, Value],
    memberchk(Name, [quoted, ignore_ops, max_depth, numbervars, variable_names,
                     syntax_errors, double_quotes, back_quotes, spacing, dotlists,
                     brace_terms, no_lists, character_escapes, fullstop, nl]),
    (   Name == variable_names -> true ; atomic(Value) ).

%   Statistics of the calling thread alone: nothing about the engine as a
%   whole (memory, atoms, threads) or other applications' work.
own_statistic(cputime).
own_statistic(inferences).
own_statistic(runtime).
own_statistic(walltime).
own_statistic(real_time).

%   Flags that tell about the engine's process rather than Prolog: its
%   command line (settings, paths), executable and process id.
hidden_flag(argv).
hidden_flag(os_argv).
hidden_flag(executable).
hidden_flag(pid).
hidden_flag(home).
hidden_flag(shared_home).
hidden_flag(associated_file).
hidden_flag(resource_database).
hidden_flag(tmp_dir).

%!  reserved_exception(?Ball) is nondet.
%
%   Exceptions application code may not catch: the SKB's limits and the
%   engine's own control.
reserved_exception(cod_limit(_)).
reserved_exception(time_limit_exceeded).
reserved_exception(time_limit_exceeded(_)).
reserved_exception(inference_limit_exceeded).
reserved_exception('$aborted').
reserved_exception(unwind(_)).
reserved_exception(cod_revoked).    % the capability ended (cod_direct.pl)

%!  tabling_goal(+QualifiedGoal) is semidet.
%
%   The goal is tabling: a tabled predicate, a predicate of the tabling
%   modules, or a trie primitive (see the module comment).  Looked up
%   without autoloading (the server has turned it off).
tabling_goal(M:Goal) :-
    functor(Goal, Name, Arity),
    (   tabling_name(Name)
    ->  true
    ;   atom(M),
        catch(tabling_property(M:Goal), _, fail)
    ->  true
    ;   catch(tabling_property(system:Goal), _, fail)
    ),
    Arity >= 0.

tabling_name(Name) :- sub_atom(Name, 0, _, _, trie_).
tabling_name(Name) :- sub_atom(Name, 0, _, _, '$tbl_').
tabling_name(Name) :- sub_atom(Name, 0, _, _, '$wfs_').
tabling_name('$tabled').
tabling_name('$table_mode').
tabling_name('$table_option').
tabling_name('$wrap$tabled_call').

tabling_property(Head) :-
    predicate_property(Head, tabled), !.
tabling_property(Head) :-
    predicate_property(Head, implementation_module(IM)),
    tabling_module(IM).

tabling_module('$tabling').
tabling_module(wfs).
tabling_module('$wfs').
tabling_module(tables).

%!  denied_reason(?Name, ?Arity, ?Reason) is nondet.
%
%   Name/Arity may not be called by application code, because Reason.
denied_reason(Name, Arity, Reason) :-
    denied(Name, Arity, Kind),
    kind_reason(Kind, Reason).
denied_reason(Name, Arity, Reason) :-
    atom(Name), integer(Arity), Arity >= 0,
    \+ denied(Name, Arity, _),
    functor(Head, Name, Arity),
    tabling_goal(system:Head),
    kind_reason(tabling, Reason).

kind_reason(reflection,
            "it reads predicates and modules, which can reach another application's namespace").
kind_reason(loading,
            "applications may not load files; library code is loaded by the SKB itself").
kind_reason(global,
            "it changes state the engine and every other application share").
kind_reason(database,
            "it changes the database; use add_facts/remove_facts").
kind_reason(control,
            "it controls the engine itself").
kind_reason(output,
            "messages of queries are not written to the daemon's log").
kind_reason(cleanup,
            "cleanup handlers run after the time limit and cannot be interrupted").
kind_reason(attributes,
            "attribute hooks run code of the module they name").
kind_reason(messages,
            "message translation runs format/3 on its arguments, outside the sandbox's checks").
kind_reason(engine,
            "it reports on the whole engine (memory, threads, other applications' work)").
kind_reason(tabling,
            "tabling keeps tables in the engine after the query, beyond every limit of the query").

% reflection
denied(clause, 2, reflection).
denied(clause, 3, reflection).
denied(nth_clause, 3, reflection).
denied(clause_property, 2, reflection).
denied(predicate_property, 2, reflection).
denied(current_predicate, 1, reflection).
denied(current_predicate, 2, reflection).
denied(current_module, 1, reflection).
denied(module_property, 2, reflection).
denied(import_module, 2, reflection).
denied(default_module, 2, reflection).
% loading code
denied(use_module, 1, loading).
denied(use_module, 2, loading).
denied(load_files, 1, loading).
denied(load_files, 2, loading).
denied(consult, 1, loading).
denied(ensure_loaded, 1, loading).
denied(include, 1, loading).
denied(autoload, 1, loading).
denied(autoload, 2, loading).
% global state
denied(set_prolog_flag, 2, global).
denied(create_prolog_flag, 3, global).
denied(set_prolog_stack, 2, global).
denied(op, 3, global).
denied(char_conversion, 2, global).
denied(b_getval, 2, global).
denied(b_setval, 2, global).
denied(nb_getval, 2, global).
denied(nb_setval, 2, global).
denied(nb_linkval, 2, global).
denied(nb_current, 2, global).
denied(nb_delete, 1, global).
denied(abolish_all_tables, 0, tabling).
denied(abolish_table_subgoals, 1, tabling).
denied(current_table, 2, tabling).
denied('$wrap_tabled', 2, tabling).
denied('$moded_wrap_tabled', 5, tabling).
denied(start_tabling, 2, tabling).
denied(start_tabling, 4, tabling).
denied(tnot, 1, tabling).
denied(not_exists, 1, tabling).
denied(undo, 1, global).
% database changes
denied(assert, 1, database).
denied(asserta, 1, database).
denied(assertz, 1, database).
denied(assert, 2, database).
denied(asserta, 2, database).
denied(assertz, 2, database).
denied(retract, 1, database).
denied(retractall, 1, database).
denied(abolish, 1, database).
denied(abolish, 2, database).
denied(erase, 1, database).
denied(recorda, 2, database).
denied(recorda, 3, database).
denied(recordz, 2, database).
denied(recordz, 3, database).
denied(recorded, 2, database).
denied(recorded, 3, database).
denied(flag, 3, database).
% the engine itself
denied(abort, 0, control).
denied(halt, 0, control).
denied(halt, 1, control).
denied(cancel_halt, 1, control).
% output
denied(print_message, 2, output).
denied(print_message_lines, 3, output).
% message translation
denied(message_to_string, 2, messages).
denied(message_to_codes, 3, messages).
denied(translate_message, 1, messages).
denied(translate_message, 3, messages).
denied(message_property, 2, messages).
% the engine as a whole
denied(statistics, 0, engine).
denied(statistics, 1, engine).
denied(garbage_collect, 0, engine).
denied(prolog_flag, 2, engine).
% cleanup handlers
denied(call_cleanup, 2, cleanup).
denied(call_cleanup, 3, cleanup).
denied(setup_call_cleanup, 3, cleanup).
denied(setup_call_catcher_cleanup, 4, cleanup).
% attributes
denied(put_attr, 3, attributes).
denied(put_attrs, 2, attributes).
