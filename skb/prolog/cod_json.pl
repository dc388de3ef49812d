/*  COD SKB: writing Prolog answers as JSON.
*/

:- module(cod_json,
          [ json_write_value/2,    % +Stream, +Term
            json_write_text/2,     % +Stream, +Text
            json_write_object/2,   % +Stream, +Pairs
            write_answer/2,        % +Stream, +Answer
            write_error_object/2   % +Stream, +Error
          ]).
:- use_module(library(http/json), []).   % for the foreign json:json_write_string/2
:- use_module(cod_errors).

/** <module> Prolog terms as JSON values

The mapping the SKB promises its clients (docs/skb-schema.md):

  - integers and floats are numbers (infinite and NaN floats are strings);
  - atoms and strings are strings (`[]` is the empty list);
  - proper lists are arrays;
  - other compound terms are objects `{"functor": Name, "args": [...]}`;
  - unbound variables are `null`.

Cyclic terms must be rejected by the caller before writing.
*/

%!  json_write_value(+Stream, +Term) is det.
json_write_value(S, V) :-
    var(V), !,
    write(S, null).
json_write_value(S, V) :-
    integer(V), !,
    write(S, V).
json_write_value(S, V) :-
    float(V), !,
    float_class(V, Class),
    (   ( Class == infinite ; Class == nan )
    ->  format(atom(A), '~w', [V]), json_write_text(S, A)
    ;   write(S, V)
    ).
json_write_value(S, []) :- !,
    write(S, '[]').
json_write_value(S, V) :-
    atom(V), !,
    json_write_text(S, V).
json_write_value(S, V) :-
    string(V), !,
    json_write_text(S, V).
json_write_value(S, [H|T]) :-
    is_list(T), !,
    put_char(S, '['),
    json_write_value(S, H),
    json_write_elements(T, S),
    put_char(S, ']').
json_write_value(S, V) :-
    compound(V), !,
    compound_name_arguments(V, Name, Args),
    write(S, '{"functor":'),
    json_write_text(S, Name),
    write(S, ',"args":'),
    json_write_value(S, Args),
    put_char(S, '}').
json_write_value(S, V) :-              % blobs (streams, clause refs...)
    format(atom(A), '~p', [V]),
    json_write_text(S, A).

json_write_elements([], _).
json_write_elements([H|T], S) :-
    put_char(S, ','),
    json_write_value(S, H),
    json_write_elements(T, S).

%!  json_write_text(+Stream, +Text) is det.
%
%   Write an atom or string as a JSON string literal.
json_write_text(S, Text) :-
    json:json_write_string(S, Text).

%!  json_write_object(+Stream, +Pairs) is det.
%
%   Write Key-Value pairs as a JSON object; a value json(Pairs) is a
%   nested object, any other value is written by json_write_value/2.
json_write_object(S, Pairs) :-
    put_char(S, '{'),
    write_object_pairs(Pairs, S),
    put_char(S, '}').

write_object_pairs([], _).
write_object_pairs([K-V|T], S) :-
    json_write_text(S, K),
    put_char(S, ':'),
    (   nonvar(V), V = json(Inner)
    ->  json_write_object(S, Inner)
    ;   json_write_value(S, V)
    ),
    (   T == [] -> true ; put_char(S, ','), write_object_pairs(T, S) ).

%!  write_answer(+Stream, +Answer) is det.
%
%   A query's answer(Solutions, Truncated, ElapsedUs) as the object
%   {"solutions": [{Var: Value, ...}, ...], "truncated": Bool, "elapsed_us": N}.
write_answer(S, answer(Solutions, Truncated, Us)) :-
    write(S, '{"solutions":['),
    write_solutions(Solutions, S),
    format(S, '],"truncated":~w,"elapsed_us":~w}', [Truncated, Us]).

write_solutions([], _).
write_solutions([Sol|T], S) :-
    json_write_object(S, Sol),
    (   T == [] -> true ; put_char(S, ','), write_solutions(T, S) ).

%!  write_error_object(+Stream, +Error) is det.
%
%   {"code": Code, "message": Sentence, "data": {...}} for an exception
%   of the engine (cod_errors.pl).
write_error_object(S, E) :-
    error_code(E, Code),
    error_message(E, Message),
    error_data(E, Data),
    write(S, '{"code":'),
    json_write_text(S, Code),
    write(S, ',"message":'),
    json_write_text(S, Message),
    write(S, ',"data":'),
    json_write_object(S, Data),
    put_char(S, '}').
