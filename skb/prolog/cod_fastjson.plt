/*  plunit tests of cod_fastjson.pl: the term reader's road gives the
    dict library(http/json) gives, and refuses every text outside the
    subset where the two agree.
*/
:- begin_tests(cod_fastjson).

:- use_module(cod_fastjson).
:- use_module(library(http/json)).

%   Texts read on the fast road: the dict is the library's.
read_fast('{"jsonrpc":"2.0","id":1,"method":"execute_query","params":{"goal":"bench_fact(X)"}}').
read_fast('{"jsonrpc": "2.0", "id": "a-7", "method": "hello", "params": {"version": 1, "token": "t"}}').
read_fast('{"a":{"b":[1,2.5,true,null,"x"]},"":3, "1": 2, "e": -1e5, "f": 1E3, "g": [], "h": {}, "i": [[1],[]]}').
read_fast('{"a" : [1 , 2 ] , "b":"é:{}[],"}').
read_fast('{"goal":"member(X, [1,2,3]) , X > 1 % not a comment in a string"}').
read_fast('{"n":123456789012345678901234567890}').

%   Texts refused on the fast road (the library decides): escapes,
%   Prolog-only syntax, non-objects, duplicates, variables.
refused('{"a":"b""c"}').
refused('{"a":0x1F}').
refused('{"a":0\'c}').
refused('{"a":1_000}').
refused('{"a":1r3}').
refused('{"a":1.0Inf}').
refused('{"a":1.5NaN}').
refused('{"a":"\\u00e9"}').
refused('{"a":"x\\ny"}').
refused('{"a":1,"a":2}').
refused('{"a":tru}').
refused('{"a":eee}').
refused('{"a":E}').
refused('{"a":[1|E]}').
refused('{"a":{E}}').
refused('{"a":- 1}').
refused('{"a":"b":"c"}').
refused('{"a":-1}').
refused('{\'a\':1}').
refused('{"a":f(x)}').
refused('{"a":1} x').
refused('{"a":1} % c').
refused('{"a":1 /* c */}').
refused('[1]').
refused('"s"').
refused('{}').
refused('{"a":1e400}').

test(same_dict_as_the_library, [forall(read_fast(Text))]) :-
    atom_string(Text, S),
    fast_json_dict(S, Fast),
    atom_json_dict(S, Lib, [value_string_as(string), tag('')]),
    assertion(Fast =@= Lib).

test(refused, [forall(refused(Text)), fail]) :-
    atom_string(Text, S),
    fast_json_dict(S, _).

%   Raw control characters in strings: the library accepts them, and so
%   does the reader, with the same string.
test(control_characters_as_the_library, [forall(member(C, [1, 9, 10, 13, 31]))]) :-
    string_codes(S, [0'{, 0'", 0'a, 0'", 0':, 0'", 0'x, C, 0'y, 0'", 0'}]),
    fast_json_dict(S, Fast),
    atom_json_dict(S, Lib, [value_string_as(string), tag('')]),
    assertion(Fast =@= Lib).

test(long_text_left_to_the_library, [fail]) :-
    length(Cs, 70000), maplist(=(0'x), Cs),
    format(string(S), '{"pad":"~s"}', [Cs]),
    fast_json_dict(S, _).

%   Nesting deeper than the reader's C stack: left to the library.
test(deep_nesting_left_to_the_library, [fail]) :-
    length(L, 30000), maplist(=(0'[), L),
    length(R, 30000), maplist(=(0']), R),
    append([`{"a":`, L, R, `}`], Cs),
    string_codes(S, Cs),
    fast_json_dict(S, _).

test(not_a_string, [error(type_error(string, abc))]) :-
    fast_json_dict(abc, _).

:- end_tests(cod_fastjson).
