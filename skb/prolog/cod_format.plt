/*  plunit tests of the format strings application code may use (cod_format.pl).
*/
:- begin_tests(cod_format).

:- use_module(cod_format).

test(refused, [forall(member(F-A-Why,
                            [ "~@"-[true]-format_directive('@'),
                              "~p"-[x]-format_directive(p),
                              '~W'-[x, [portray_goal(call)]]-format_directive('W'),
                              "~a ~@"-[x, true]-format_directive('@'),
                              '~t~*|'-[200000000]-format_star('|', 1000),
                              '~t~*|'-[_]-format_star('|', 1000),
                              '~*c'-[N, 0'x]-format_star(c, 1000),
                              '~a~t~*+'-[x, 1001]-format_star(+, 1000),
                              '~w~*c'-Unknown-format_star(c, 1000),
                              '~t~200000000|'-[]-format_argument('|', 200000000, 1000),
                              '~100000000e'-[1.0]-format_argument(e, 100000000, 1000),
                              '~100000000f'-[1]-format_argument(f, 100000000, 1000),
                              '~1001g'-[1.0]-format_argument(g, 1001, 1000),
                              '~100000d'-[5]-format_argument(d, 100000, 1000),
                              '~100000000n'-[]-format_argument(n, 100000000, 1000),
                              '~99999999999999999999c'-[0'x]-format_argument(c, 99999999999999999999, 1000),
                              F0-[]-format_string(F0),
                              "~"-[]-format_string("~"),
                              [0'~, X]-[]-format_string([0'~, X])
                            ]))]) :-
    ignore(N = _), ignore(Unknown = _), ignore(X = _),
    format_refusal(F, A, Why0),
    Why0 =@= Why.

test(allowed, [forall(member(F-A,
                            [ "~w and ~q"-[a, b], '~a~t~20|~w'-[x, y], '~2f'-[1.5], '~e'-[1.0],
                              '~*c'-[1000, 0'x], '~`-t~30|'-[], '~t~w~10+'-[x], "~s"-[[0'a]],
                              '~D'-[1234567], "plain text"-[], "~w"-x, [0'~, 0'w]-[y],
                              '~a~*c'-[x, 3, 0'y], '~*t~20|'-[0'-]
                            ]))]) :-
    \+ format_refusal(F, A, _).

:- end_tests(cod_format).
