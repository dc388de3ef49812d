/*  COD SKB: JSON text to a dict through SWI-Prolog's own term reader.
*/

:- module(cod_fastjson,
          [ fast_json_dict/2         % +Text, -Dict
          ]).
:- use_module(library(error)).
:- use_module(library(apply)).
:- use_module(library(pcre)).

/** <module> A request's JSON, read in C

A direct query's request, `{"jsonrpc":"2.0","id":1,"method":...}`, is
also a Prolog term: a `{}/1` term of `Key:Value` pairs, with strings,
numbers and the atoms true, false and null.  SWI-Prolog's reader (C)
reads it in a quarter of the time library(http/json) (Prolog) takes.  The
checks below are one regular expression (PCRE, C): the whole costs about
half of the library's (docs/design-rm.md, "Where the microseconds go";
they were split_string/4 and word lists before, 13.0 against 15.2 us).

fast_json_dict/2 takes this road only for text on which the reader and
library(http/json) agree: no backslash (the escapes differ; raw control
characters in strings both accept alike), no character outside strings
but JSON punctuation, digits,
signs, exponents and the words true, false and null (so no quoted atom,
operator, comment, `0x`, `0'c`, digit group, rational or Inf), no two
string literals side by side (`"a""b"` is one Prolog string), and at most
max_chars characters.  The term read must then have exactly the shape of
a JSON value.  Whatever fails a check fails: the caller parses the text
with library(http/json), which accepts or refuses it as before.  The dict
is the one atom_json_dict/3 gives with value_string_as(string): keys are
atoms, strings are strings.
*/

max_chars(65536).

%!  fast_json_dict(+Text:string, -Dict) is semidet.
%
%   Dict is the JSON object Text, read by the term reader; fails for
%   any text outside the subset described above (the caller then uses
%   library(http/json)).  An error term (syntax, resource, duplicate
%   key) fails; any other exception (a signal sent to the thread, such
%   as a revocation) is not caught.
fast_json_dict(Text, Dict) :-
    must_be(string, Text),
    string_length(Text, Len),
    max_chars(Max),
    Len =< Max,
    subset_regex(Re),
    re_match(Re, Text),
    % An error (a nesting deeper than the reader's C stack, a duplicate
    % key) fails, and the library decides; a signal (not error(_, _))
    % passes through.
    catch(( term_string(Term, Text, [syntax_errors(quiet), module(cod_fastjson)]),
            nonvar(Term),
            Term = {_},
            json_value(Term, Dict) ),
          error(_, _), fail).

%   subset_regex(-Re): the whole text is a sequence of JSON punctuation,
%   whitespace, digits, signs, exponents, the words true, false and null,
%   and string literals with no backslash, none followed at once by
%   another (`"a""b"` is one Prolog string).  Compiled once (the first
%   call; a race only compiles it twice).
:- dynamic compiled_subset_regex/1.

subset_regex(Re) :-
    (   compiled_subset_regex(Re0)
    ->  Re = Re0
    ;   re_compile("^(?:[][{}:, \\t\\r\\n+.0-9eE-]++|true|false|null|\"[^\"\\\\]*+\"(?!\"))*+\\z",
                   Re, [optimise(true)]),
        assertz(compiled_subset_regex(Re))
    ).

json_value(V, _) :- var(V), !, fail.        % E, E1: letters of exponents
json_value(V, V) :- string(V), !.
json_value(V, V) :- integer(V), !.
json_value(V, V) :- float(V), !, V =:= V, abs(V) < inf.
json_value(V, V) :- atom(V), memberchk(V, [true, false, null]), !.
json_value(V, V) :- V == [], !.
json_value([H|T], [JH|JT]) :- !,
    json_value(H, JH),
    json_list(T, JT).
json_value({}, Dict) :- !,
    dict_pairs(Dict, _, []).
json_value({Members}, Dict) :-
    members_pairs(Members, Pairs),
    dict_pairs(Dict, _, Pairs).

json_list(T, _) :- var(T), !, fail.
json_list(T, []) :- T == [], !.
json_list([H|T], [JH|JT]) :-
    json_value(H, JH),
    json_list(T, JT).

members_pairs(M, _) :- var(M), !, fail.
members_pairs((A, B), [P|Ps]) :- !,
    member_pair(A, P),
    members_pairs(B, Ps).
members_pairs(A, [P]) :-
    member_pair(A, P).

member_pair(K:V, Key-JV) :-
    string(K),
    atom_string(Key, K),
    json_value(V, JV).
