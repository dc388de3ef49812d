/*  COD SKB: which format strings application code may use.
*/

:- module(cod_format,
          [ format_refusal/3,        % +Format, +Args, -Why
            max_format_argument/1    % -Max
          ]).
:- use_module(library(prolog_format), [format_spec/2]).

/** <module> Format strings of application code

format/1,2,3 are allowed to applications (library(sandbox) white-lists
them), but some directives are not data:

  - `~@` calls a goal, `~p` calls the portray hooks, `~W` takes write
    options from its arguments (portray_goal(G) calls G);
  - a numeric argument is a column stop (`~N|`, `~N+`), a count (`~Nc`,
    `~Nn`), a precision (`~Ne`, `~Nf`, `~Ng`) or digit group (`~Nd`,
    `~ND`), and format/2 fills it in C, where no time limit interrupts
    it: `~t~*|` with 200,000,000 runs for seconds and takes gigabytes.

So a format string of application code must be text written in the goal
itself (the deny layer sees it when the goal is checked, before it runs),
use none of `~@ ~p ~W`, and every numeric argument is at most
max_format_argument/1: written in the string, or for `~*` the argument
at its place, which must then be an integer in the goal as written.  The
fill character of `~t` (`~`ct`, `~Nt`) is a character, not a size.
*/

%!  max_format_argument(-Max) is det.
max_format_argument(1000).

%!  format_refusal(@Format, @Args, -Why) is semidet.
%
%   True when format(Format, Args) may not run as application code,
%   because of Why: format_string(Format), format_directive(D),
%   format_argument(D, N, Max) or format_star(D, Max).
format_refusal(Format, _, format_string(Format)) :-
    \+ format_text(Format, _), !.
format_refusal(Format, _, format_string(Format)) :-
    format_text(Format, S),
    \+ catch(format_spec(S, _), _, fail), !.
format_refusal(Format, Args, Why) :-
    format_text(Format, S),
    format_spec(S, Spec),
    (   is_list(Args) -> Known = Args
    ;   nonvar(Args), Args \= [_|_] -> Known = [Args]   % format/2's single argument
    ;   Known = unknown
    ),
    spec_refusal(Spec, Known, Why).

format_text(F, S) :-
    (   atom(F) -> atom_string(F, S)
    ;   string(F) -> S = F
    ;   is_list(F), ground(F), catch(text_to_string(F, S), _, fail)
    ).

%   spec_refusal(+Spec, +Args, -Why): the first directive of Spec refused,
%   with Args the arguments from the directive on (or unknown).
spec_refusal([text(_)|T], Args, Why) :- !,
    spec_refusal(T, Args, Why).
spec_refusal([escape(Num, _, D)|T], Args, Why) :-
    (   memberchk(D, ['@', p, 'W'])
    ->  Why = format_directive(D)
    ;   numeric_refusal(Num, D, Args, Why)
    ->  true
    ;   consumes(Num, D, K),
        drop_args(K, Args, Rest),
        spec_refusal(T, Rest, Why)
    ).

numeric_refusal(number(N), D, _, format_argument(D, N, Max)) :-
    D \== t,
    max_format_argument(Max),
    N > Max.
numeric_refusal(star, D, Args, format_star(D, Max)) :-
    D \== t,
    max_format_argument(Max),
    \+ ( Args = [N|_], integer(N), N >= 0, N =< Max ).

%   consumes(+Numeric, +Directive, -Count): how many arguments it takes.
consumes(Num, D, K) :-
    (   Num == star -> K0 = 1 ; K0 = 0 ),
    (   takes(D, K1) -> true ; K1 = 0 ),
    K is K0 + K1.

takes(a, 1). takes(c, 1). takes(d, 1). takes('D', 1). takes(e, 1).
takes(f, 1). takes(g, 1). takes(i, 1). takes('I', 1). takes(k, 1).
takes(q, 1). takes(r, 1). takes('R', 1). takes(s, 1). takes(w, 1).

drop_args(_, unknown, unknown) :- !.
drop_args(0, Args, Args) :- !.
drop_args(K, [_|T], Rest) :- !,
    K1 is K - 1,
    drop_args(K1, T, Rest).
drop_args(_, _, unknown).
