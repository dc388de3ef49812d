/*  COD SKB: an application's facts, their owners and their removal.
*/

:- module(cod_facts,
          [ add_facts/5,           % +App, +Owner, +Texts, +Limits, -Count
            remove_facts/3,        % +App, +PatternTexts, -Count
            list_facts/3,          % +App, +PredicateOrAll, -Texts
            erase_fact/2           % +Module, +ClauseRef
          ]).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(cod_namespaces).
:- use_module(cod_parse).

/** <module> Application facts

Facts must be ground and named by a word, and may not define a built-in,
a system-level or a library predicate, nor extend a procedure.  Facts
remember who added them (fact_owner/2): a connection of the application
(`conn(Id)`) or `persistent`; a fact added again gets one more holder.
*/

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
