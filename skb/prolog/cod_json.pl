/*  COD SKB: writing Prolog answers as JSON.
*/

:- module(cod_json,
          [ json_write_value/2,    % +Stream, +Term
            json_write_text/2,     % +Stream, +Text
            json_write_object/2,   % +Stream, +Pairs
            write_answer/2,        % +Stream, +Answer
            answer_size_within/2,  % +Solutions, +MaxBytes
            write_error_object/2   % +Stream, +Error
          ]).
:- use_module(library(http/json), []).   % for the foreign json:json_write_string/2
:- use_module(library(apply)).
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

% What an answer may hold, so that every client can read it: JSON nested
% deeper than this is refused by common parsers (Python's recursion limit is
% about 1000), and integers with more digits cost quadratic time to convert.
max_depth(256).
max_integer_bits(332200).               % 100,000 decimal digits

%!  json_write_value(+Stream, +Term) is det.
%
%   @error representation_error(cod_answer_depth) when Term nests deeper
%          than max_depth/1, representation_error(cod_integer_size) for an
%          integer of more than 100,000 digits.
json_write_value(S, V) :-
    max_depth(D),
    json_write_value(S, V, D).

json_write_value(_, _, 0) :- !,
    max_depth(D),
    throw(error(representation_error(cod_answer_depth), max_depth(D))).
json_write_value(S, V, _) :-
    var(V), !,
    write(S, null).
json_write_value(S, V, _) :-
    integer(V), !,
    (   V =\= 0, msb(abs(V)) > 332200
    ->  throw(error(representation_error(cod_integer_size), digits(100000)))
    ;   write(S, V)
    ).
json_write_value(S, V, _) :-
    float(V), !,
    float_class(V, Class),
    (   ( Class == infinite ; Class == nan )
    ->  format(atom(A), '~w', [V]), json_write_text(S, A)
    ;   write(S, V)
    ).
json_write_value(S, [], _) :- !,
    write(S, '[]').
json_write_value(S, V, _) :-
    atom(V), !,
    json_write_text(S, V).
json_write_value(S, V, _) :-
    string(V), !,
    json_write_text(S, V).
json_write_value(S, [H|T], D) :-
    is_list(T), !,
    D1 is D - 1,
    put_char(S, '['),
    json_write_value(S, H, D1),
    json_write_elements(T, S, D1),
    put_char(S, ']').
json_write_value(S, V, D) :-
    compound(V), !,
    D1 is D - 1,
    compound_name_arguments(V, Name, Args),
    write(S, '{"functor":'),
    json_write_text(S, Name),
    write(S, ',"args":'),
    json_write_value(S, Args, D1),
    put_char(S, '}').
json_write_value(S, V, _) :-              % blobs (streams, clause refs...): no print hook
    format(atom(A), '~w', [V]),
    json_write_text(S, A).

json_write_elements([], _, _).
json_write_elements([H|T], S, D) :-
    put_char(S, ','),
    json_write_value(S, H, D),
    json_write_elements(T, S, D).

%!  answer_size_within(+Solutions, +MaxBytes) is det.
%
%   Check, before anything is written, that the text of Solutions is not
%   far over MaxBytes (an estimate within a factor of two, that never
%   undercounts the text of atoms, strings and numbers): writing a 100 MB
%   answer only to refuse it would hold its thread for seconds.  The exact
%   size is checked once it is written.
%   @error resource_error(cod_reply(Estimate, MaxBytes))
answer_size_within(Solutions, Max) :-
    Bound is 2 * Max,
    catch(foldl(term_text_size(Bound), Solutions, 0, _), cod_over(Size),
          throw(error(resource_error(cod_reply(Size, Max)), _))).

term_text_size(Max, T, N0, N) :-
    (   var(T) -> N1 is N0 + 4
    ;   atomic(T) -> text_size(T, L), N1 is N0 + L + 2
    ;   T = [H|Tail]                         % a list cell is one comma in JSON
    ->  term_text_size(Max, H, N0, N2),
        term_text_size(Max, Tail, N2, N3),
        N1 is N3 + 1
    ;   compound(T)
    ->  compound_name_arity(T, Name, Arity),
        atom_length(Name, L),
        N2 is N0 + L + 24,
        (   N2 > Max -> throw(cod_over(N2)) ; true ),
        foldl_args(1, Arity, T, Max, N2, N1)
    ;   N1 = N0
    ),
    (   N1 > Max -> throw(cod_over(N1)) ; true ),
    N = N1.

foldl_args(I, Arity, _, _, N, N) :- I > Arity, !.
foldl_args(I, Arity, T, Max, N0, N) :-
    arg(I, T, A),
    term_text_size(Max, A, N0, N1),
    I2 is I + 1,
    foldl_args(I2, Arity, T, Max, N1, N).

text_size(T, L) :-
    (   string(T) -> string_length(T, L)
    ;   atom(T) -> atom_length(T, L)
    ;   integer(T), T =\= 0 -> L is msb(abs(T)) // 3 + 2
    ;   L = 24
    ).

%!  json_write_text(+Stream, +Text) is det.
%
%   Write an atom or string as a JSON string literal.
json_write_text(S, Text) :-
    json:json_write_string(S, Text).

%!  json_write_object(+Stream, +Pairs) is det.
%
%   Write Key-Value pairs as a JSON object; a value json(Pairs) is a
%   nested object, objects(List) an array of json(Pairs) objects, bool(B)
%   the JSON literal true or false, any other
%   value is written by json_write_value/2.
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
    ;   nonvar(V), V = bool(B)
    ->  ( B == true -> write(S, true) ; write(S, false) )
    ;   nonvar(V), V = objects(Objects)
    ->  put_char(S, '['),
        write_objects(Objects, S),
        put_char(S, ']')
    ;   json_write_value(S, V)
    ),
    (   T == [] -> true ; put_char(S, ','), write_object_pairs(T, S) ).

write_objects([], _).
write_objects([json(Pairs)|T], S) :-
    json_write_object(S, Pairs),
    (   T == [] -> true ; put_char(S, ','), write_objects(T, S) ).

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
