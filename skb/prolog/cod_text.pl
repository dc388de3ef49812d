/*  COD SKB: the one writer of application terms into text.
*/

:- module(cod_text,
          [ bounded_text/2,          % +Term, -String
            bounded_text/3,          % +Term, +Options, -String
            bounded_plain/2,         % +Text, -String
            bounded_line/2,          % +String0, -String
            max_text_chars/1         % -Chars
          ]).

/** <module> Application terms as bounded text

Whenever the engine turns a term an application made (an exception's
ball, a culprit in an error) into text, it goes through bounded_text/2:

  - write_term/3 with quoted(true), portray(false) and no message
    translation: no hook, no goal and no format directive of the term is
    ever run (a ball such as format("~@", [shell(..)]) is data);
  - on a bounded copy of the term: at most max_depth/1 levels and
    max_nodes/1 subterms (what is left off is the atom '...'), atoms and
    strings cut after max_atom_chars/1 characters (ending in "..."),
    integers of more than max_digits/1 digits shown by their size only,
    variables (and their attributes) as `_`;
  - and the resulting text cut after max_text_chars/1 characters.

So the cost of the text is bounded whatever the term: a 100 MB atom or
a cyclic term costs as much as a short one.
*/

:- use_module(library(error)).
:- use_module(library(apply)).

max_depth(8).
max_nodes(200).
max_atom_chars(200).
max_digits(60).

%!  max_text_chars(-Chars) is det.
%
%   The longest text bounded_text/2 and bounded_plain/2 return.
max_text_chars(1000).

%!  bounded_text(@Term, -String) is det.
%
%   String is Term written quoted, within the bounds above.
bounded_text(Term, String) :-
    bounded_text(Term, [], String).

%!  bounded_text(@Term, +Options, -String) is det.
%
%   As bounded_text/2; Options is [] or [ignore_ops(true)] (as
%   write_canonical/1 writes operators).
bounded_text(Term, Options, String) :-
    must_be(oneof([[], [ignore_ops(true)]]), Options),
    max_depth(D),
    max_nodes(N),
    bounded_copy(Term, D, Copy, N, _),
    with_output_to(string(S0),
                   write_term(Copy, [ quoted(true), portray(false), numbervars(true),
                                      character_escapes(true), spacing(standard)
                                    | Options ])),
    max_text_chars(Max),
    cut_text(S0, Max, String).

%!  bounded_line(+String0, -String) is det.
%
%   A sentence made of bounded pieces, cut after max_line_chars/1
%   characters (an error message is one such line).
bounded_line(S0, S) :-
    max_line_chars(Max),
    cut_text(S0, Max, S).

max_line_chars(2000).

%!  bounded_plain(@Text, -String) is det.
%
%   An atom or string as it is (not quoted), cut after max_text_chars/1
%   characters, with line breaks and other control characters as spaces.
%   Any other term as bounded_text/2 writes it.
bounded_plain(Text, String) :-
    (   atom(Text) -> true ; string(Text) ),
    !,
    max_text_chars(Max),
    text_prefix(Text, Max, Prefix, Cut),
    string_codes(Prefix, Codes0),
    maplist(printable, Codes0, Codes),
    string_codes(S0, Codes),
    (   Cut == true -> string_concat(S0, "...", String) ; String = S0 ).
bounded_plain(Term, String) :-
    bounded_text(Term, String).

printable(C0, C) :-
    (   ( C0 < 0x20 ; C0 == 0x7f ; between(0x80, 0x9f, C0) ; C0 == 0x2028 ; C0 == 0x2029 )
    ->  C = 0'\s
    ;   C = C0
    ).

cut_text(S0, Max, S) :-
    string_length(S0, Len),
    (   Len =< Max
    ->  S = S0
    ;   sub_string(S0, 0, Max, _, P),
        string_concat(P, "...", S)
    ).

%   text_prefix(+Text, +Max, -Prefix, -Cut): at most Max characters of an
%   atom or string; Cut is true when some were left off.
text_prefix(Text, Max, Prefix, Cut) :-
    (   atom(Text) -> atom_length(Text, Len) ; string_length(Text, Len) ),
    (   Len =< Max
    ->  Prefix = Text, Cut = false
    ;   sub_string(Text, 0, Max, _, Prefix), Cut = true
    ).

%   bounded_copy(@Term, +Depth, -Copy, +Nodes0, -Nodes): Copy is Term
%   within the bounds.  Variables become '$VAR'('_'), which write_term/2
%   with numbervars(true) writes as `_`.
bounded_copy(_, _, '...', N0, N) :-
    N0 =< 0, !,
    N = N0.
bounded_copy(T, _, '$VAR'('_'), N0, N) :-
    var(T), !,
    N is N0 - 1.
bounded_copy(T, _, Copy, N0, N) :-
    atomic(T), !,
    N is N0 - 1,
    bounded_atomic(T, Copy).
bounded_copy(_, 0, '...', N0, N) :- !,
    N is N0 - 1.
bounded_copy([H|T], D, [CH|CT], N0, N) :- !,  % a list's length counts, not its depth
    N1 is N0 - 1,
    D1 is D - 1,
    bounded_copy(H, D1, CH, N1, N2),
    bounded_copy(T, D, CT, N2, N).
bounded_copy(T, D, Copy, N0, N) :-
    is_dict(T), !,
    dict_pairs(T, Tag, Pairs),
    bounded_copy(dict(Tag, Pairs), D, Copy, N0, N).
bounded_copy(T, D, Copy, N0, N) :-
    compound_name_arity(T, Name, Arity),
    N1 is N0 - 1,
    D1 is D - 1,
    bounded_atomic(Name, CName),
    (   atom(CName)
    ->  copy_args(1, Arity, T, D1, Args, N1, N),
        compound_name_arguments(Copy, CName, Args)
    ;   Copy = CName, N = N1                % a name too long to show
    ).

copy_args(I, Arity, _, _, [], N, N) :-
    I > Arity, !.
copy_args(_, _, _, _, ['...'], N, N) :-
    N =< 0, !.
copy_args(I, Arity, T, D, [C|Cs], N0, N) :-
    arg(I, T, A),
    bounded_copy(A, D, C, N0, N1),
    I1 is I + 1,
    copy_args(I1, Arity, T, D, Cs, N1, N).

bounded_atomic(T, Copy) :-
    (   integer(T)
    ->  bounded_integer(T, Copy)
    ;   rational(T)
    ->  rational(T, Num, Den),
        bounded_integer(Num, CNum),
        bounded_integer(Den, CDen),
        (   integer(CNum), integer(CDen) -> Copy = T ; Copy = '<a rational too large to show>' )
    ;   ( atom(T) ; string(T) )
    ->  bounded_name(T, Copy)
    ;   Copy = T                            % floats, blobs: short by nature
    ).

bounded_integer(I, Copy) :-
    max_digits(Max),
    (   abs(I) < 10^Max
    ->  Copy = I
    ;   Digits is truncate(msb(abs(I)) * log10(2)) + 1,
        format(atom(Copy), '<an integer of about ~D digits>', [Digits])
    ).

bounded_name(T, Copy) :-
    max_atom_chars(Max),
    text_prefix(T, Max, Prefix, Cut),
    (   Cut == false
    ->  Copy = T
    ;   string_concat(Prefix, "...", Cut1),
        (   atom(T) -> atom_string(Copy, Cut1) ; Copy = Cut1 )
    ).
