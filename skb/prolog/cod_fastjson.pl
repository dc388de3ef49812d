/*  COD SKB: JSON text to a dict through SWI-Prolog's own term reader.
*/

:- module(cod_fastjson,
          [ fast_json_dict/2         % +Text, -Dict
          ]).
:- use_module(library(error)).
:- use_module(library(apply)).

/** <module> A request's JSON, read in C

A direct query's request, `{"jsonrpc":"2.0","id":1,"method":...}`, is
also a Prolog term: a `{}/1` term of `Key:Value` pairs, with strings,
numbers and the atoms true, false and null.  SWI-Prolog's reader (C)
reads it in a quarter of the time library(http/json) (Prolog) takes; with
the checks below the whole costs about four fifths of the library's
(13.0 against 15.2 CPU us for a query's request; docs/design-rm.md).

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
    \+ sub_atom_icasechk(Text, _, '\\'),
    split_string(Text, "\"", "", Parts),
    outside_strings(Parts, Outside),
    atomic_list_concat(Outside, ' ', AllOutside),
    split_string(AllOutside, "{}[]:, \t\r\n-+.0123456789eE", "", Words),
    maplist(json_word, Words),
    % An error (a nesting deeper than the reader's C stack, a duplicate
    % key) fails, and the library decides; a signal (not error(_, _))
    % passes through.
    catch(( term_string(Term, Text, [syntax_errors(quiet), module(cod_fastjson)]),
            nonvar(Term),
            Term = {_},
            json_value(Term, Dict) ),
          error(_, _), fail).

%   outside_strings(+Parts, -Outside): the parts of the text split at '"'
%   that lie outside strings (the even ones).  None may be empty: no
%   "a""b", one Prolog string.
outside_strings([Out], [Out]) :- !,
    Out \== "".
outside_strings([Out, _String|Rest], [Out|Outs]) :-
    Out \== "",
    outside_strings(Rest, Outs).

% what remains of true, false and null once e is a separator
json_word("").
json_word("tru").
json_word("fals").
json_word("null").

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
