/*  COD SKB: reading the text an application sends.
*/

:- module(cod_parse, [parse_terms/4]).  % +Module, +Text, -TermsWithBindings, +Options
:- use_module(library(error)).

/** <module> Reading application text

Every fact, clause, pattern and goal an application sends is text, read
here with its namespace's operators; a syntax error says where.
*/

%!  parse_terms(+Module, +Text, -Terms, +Options) is det.
%
%   Read all terms of Text (operators of Module), each as Term-Bindings.
%   A text whose last term lacks its full stop gets one.
%   @error syntax_error(Message) with context text_position(Line, Column).
parse_terms(M, Text, Terms, _Options) :-
    must_be(text, Text),
    string_concat(Text, "\n.", Closed0),
    (   ends_with_full_stop(Text)
    ->  Closed = Text
    ;   Closed = Closed0
    ),
    setup_call_cleanup(
        open_string(Closed, S),
        read_all(S, M, Terms),
        close(S)).

ends_with_full_stop(Text) :-
    split_string(Text, "", " \t\r\n", [Trimmed]),
    (   Trimmed == ""
    ->  true
    ;   sub_string(Trimmed, _, 1, 0, ".")
    ).

read_all(S, M, Terms) :-
    catch(read_term(S, T, [ variable_names(Vs), module(M),
                            syntax_errors(error), backquoted_string(false) ]),
          error(syntax_error(E), stream(_, Line, LinePos, _)),
          (   Col is LinePos + 1,
              throw(error(syntax_error(E), text_position(Line, Col)))
          )),
    (   T == end_of_file
    ->  Terms = []
    ;   Terms = [T-Vs|Rest],
        read_all(S, M, Rest)
    ).
