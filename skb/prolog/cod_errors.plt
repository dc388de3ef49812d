/*  plunit tests of error reports (cod_errors.pl) and the bounded writer (cod_text.pl).
*/
:- begin_tests(cod_errors).

:- use_module(cod_errors).
:- use_module(cod_text).

%   A goal inside an application's exception that would show it ran.
:- public mark/0.
mark :- flag(cod_errors_plunit_mark, _, 1).

ran_nothing(Ball) :-
    flag(cod_errors_plunit_mark, _, 0),
    error_message(Ball, M),
    string(M),
    flag(cod_errors_plunit_mark, V, V),
    V == 0.

test(application_terms_are_never_formatted,
     [forall(member(B, [ format("~@", [plunit_cod_errors:mark]),
                         error(format("~@", [plunit_cod_errors:mark]), _),
                         error(foo, context(bar, format("~@", [plunit_cod_errors:mark]))),
                         error(type_error(integer, x), context(format("~@", [plunit_cod_errors:mark]), y)),
                         error(existence_error(procedure, format("~@", [plunit_cod_errors:mark])), _),
                         error(resource_error(format("~@", [plunit_cod_errors:mark])), _),
                         format("~@", [(repeat, fail)]),
                         message_lines(['~@'-[plunit_cod_errors:mark]])
                       ]))]) :-
    ran_nothing(B).

test(text_of_a_format_ball_is_the_term) :-
    error_message(format("~@", [shell(x)]), M),
    once(sub_string(M, _, _, _, "format(\"~@\",[shell(x)])")).

test(huge_atom_is_cut, [true(Len =< 2000)]) :-
    length(Cs, 1000), maplist(=(0'x), Cs), atom_codes(A0, Cs),
    double(16, A0, A),                          % 65,536,000 characters
    get_time(T0),
    error_message(error(type_error(integer, A), context(foo/1, A)), M),
    error_data(error(resource_error(A), _), Data),
    get_time(T1),
    assertion(T1 - T0 < 1.0),
    assertion(forall(member(_-V, Data), ( string(V) -> string_length(V, L), L =< 1003 ; true ))),
    string_length(M, Len).

double(0, A, A) :- !.
double(N, A0, A) :- atom_concat(A0, A0, A1), N1 is N - 1, double(N1, A1, A).

test(huge_integer_is_not_echoed) :-
    X is 10^5000,
    error_message(error(type_error(integer, X), _), M),
    string_length(M, L),
    assertion(L < 200),
    once(sub_string(M, _, _, _, "digits")),
    error_data(error(foo, fact(X, x)), Data),
    assertion(\+ memberchk(index-_, Data)).

test(cyclic_and_deep_terms_are_bounded) :-
    T = f(T),
    error_message(T, M1), string_length(M1, L1), assertion(L1 < 200),
    numlist(1, 100000, L), W =.. [g|L],
    error_message(W, M2), string_length(M2, L2), assertion(L2 =< 2000).

test(nested_inference_limit_is_a_resource_error) :-
    error_code(inference_limit_exceeded, resource),
    error_message(inference_limit_exceeded, M),
    once(sub_string(M, _, _, _, "inference limit")).

test(iso_errors_keep_their_words, [forall(member(E-Text,
        [ error(type_error(evaluable, foo/0), context(system:(is)/2, _))-"is/2: Arithmetic: `foo/0' is not a function",
          error(instantiation_error, context(system:atom_length/2, _))-"atom_length/2: Arguments are not sufficiently instantiated",
          error(type_error(integer, a), context(system:atom_length/2, _))-"atom_length/2: Type error: `integer' expected, found `a' (an atom)",
          error(existence_error(procedure, app_x:nope/1), _)-"unknown procedure nope/1",
          error(foo, context(bar, baz))-"bar: Unknown error term: foo (baz)"
        ]))]) :-
    error_message(E, M),
    M == Text.

test(bounded_text_is_quoted_and_plain) :-
    bounded_text(f('a b', "s", [1, 2], _), S),
    S == "f('a b',\"s\",[1,2],_)",
    bounded_plain('two\nlines', P),
    P == "two lines".

:- end_tests(cod_errors).
