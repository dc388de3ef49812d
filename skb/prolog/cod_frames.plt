:- begin_tests(cod_frames).
:- use_module(cod_frames).
:- use_module(library(http/json)).
:- use_module(library(memfile)).

%   frame_read(+Reader, +Bytes, +Max, -Frame): Frame as Reader (c or
%   prolog) reads the frame made of Bytes (header included).
frame_read(Reader, [B0|Bytes], Max, Frame) :-
    new_memory_file(MF),
    setup_call_cleanup(open_memory_file(MF, write, W, [encoding(octet)]),
                       maplist(put_byte(W), Bytes), close(W)),
    setup_call_cleanup(open_memory_file(MF, read, In, [encoding(octet)]),
                       reader_frame(Reader, In, B0, Max, Frame),
                       close(In)),
    free_memory_file(MF).

reader_frame(c, In, B0, Max, Frame) :-
    cod_frames:c_frames,
    read_frame_json(In, B0, Max, Frame).
reader_frame(prolog, In, B0, Max, Frame) :-
    cod_frames:prolog_frame(In, B0, Max, Frame).

frame_bytes(Text, [B0, B1, B2, B3|Bytes]) :-
    string_bytes(Text, Bytes, utf8),
    length(Bytes, Len),
    B0 is (Len >> 24) /\ 0xff, B1 is (Len >> 16) /\ 0xff,
    B2 is (Len >> 8) /\ 0xff, B3 is Len /\ 0xff.

library_dict(Text, Dict) :-
    catch(atom_json_dict(Text, Dict, [value_string_as(string), tag('')]), _, fail).

readers([c, prolog]).

%   Texts a reader takes itself (json): the dict must be the library's.
parsed("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"execute_query\",\"params\":{\"goal\":\"f(X)\"}}").
parsed("{\"a\":1,\"b\":\"x\",\"c\":[1,2.5,true,false,null,{}],\"d\":{\"e\":[]}}").
parsed("{\"a\":\"é€😀\"}").
parsed("{\"1\":2, \"\":3}").
parsed("{\"a\":1e5,\"b\":-0,\"c\":1E2,\"d\":-2.5e-3}").
parsed("{}").
parsed(" {\"a\" : [ ] } \n").
parsed("{\"a\":\"\\u00e9\\n\\\"\\/\\\\\"}").
parsed("{\"id\":\"x\",\"params\":{\"goal\":\"atom_length('a\\\\'b', N)\"}}").

%   Texts no reader may take itself: they go to the library (text).
declined("{\"a\":\"\\uDC00\"}").               % a lone surrogate
declined("{\"a\":1,\"a\":2}").                 % duplicate key
declined("[1]").                               % not an object
declined("{\"a\":12345678901234567890123}").   % beyond 64 bits
declined("{\"a\":\"\\u0000\"}").               % NUL
declined("{\"a\":1e999}").                     % not a finite float
declined("{\"a\":1,}").                        % syntax
declined("{\"a\":\"x\"} {}").                  % trailing text
declined("{\"a\":0x10}").
declined("").

test(c_parses_as_the_library_does, [forall(parsed(T)), true(Got =@= json(Want))]) :-
    cod_frames:c_frames,
    frame_bytes(T, Bytes),
    frame_read(c, Bytes, 65536, Got),
    library_dict(T, Want).

%   An escaped surrogate pair is one character (RFC 8259), not the
%   library's two surrogate code points.
test(c_joins_an_escaped_surrogate_pair, [true(Got =@= json(_{a:"\U0001F600"}))]) :-
    cod_frames:c_frames,
    frame_bytes("{\"a\":\"\\ud83d\\ude00\"}", Bytes),
    frame_read(c, Bytes, 65536, Got).

test(c_leaves_to_the_library, [forall(declined(T)), true(Got == text(T))]) :-
    cod_frames:c_frames,
    frame_bytes(T, Bytes),
    frame_read(c, Bytes, 65536, Got).

%   The Prolog reader's subset is narrower (cod_fastjson.pl): what it
%   takes must be the library's dict, what it declines comes back whole.
test(prolog_reader_agrees_with_the_library, [forall((parsed(T) ; declined(T)))]) :-
    frame_bytes(T, Bytes),
    frame_read(prolog, Bytes, 65536, Got),
    agrees(Got, T).

agrees(json(Dict), T) :- library_dict(T, Want), Dict =@= Want.
agrees(text(T0), T) :- T0 == T.

%   Over 64 KiB a body is left to the library (jansson's memory is not
%   under the engine's stack limits).
test(c_leaves_a_large_body_to_the_library, [true(Got == text(T))]) :-
    cod_frames:c_frames,
    length(Xs, 70000), maplist(=(0'x), Xs), string_codes(X, Xs),
    format(string(T), "{\"goal\":\"~s\"}", [X]),
    frame_bytes(T, Bytes),
    frame_read(c, Bytes, 1048576, Got).

test(c_parses_a_body_of_64_kib, [true(Got = json(_))]) :-
    cod_frames:c_frames,
    length(Xs, 65525), maplist(=(0'x), Xs), string_codes(X, Xs),
    format(string(T), "{\"goal\":\"~s\"}", [X]),
    string_length(T, 65536),
    frame_bytes(T, Bytes),
    frame_read(c, Bytes, 1048576, Got).

test(invalid_utf8_is_decoded_as_before, [forall((readers(Rs), member(R, Rs)))]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    Body = [0'{, 0'", 0'a, 0'", 0':, 0'", 0xff, 0xc3, 0'", 0'}],
    string_bytes(Want, Body, utf8),
    length(Body, Len),
    frame_read(R, [0, 0, 0, Len|Body], 65536, Got),
    (   R == c
    ->  Got == text(Want)
    ;   agrees(Got, Want)
    ).

test(header_over_the_limit_is_not_read, [forall((readers(Rs), member(R, Rs))), true(Got == too_big(70000))]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    frame_read(R, [0, 1, 0x11, 0x70, 0'{], 65536, Got).

test(end_inside_the_header, [forall((readers(Rs), member(R, Rs))), true(Got == closed)]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    frame_read(R, [0, 0], 65536, Got).

test(end_inside_the_body, [forall((readers(Rs), member(R, Rs))), true(Got == closed)]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    frame_read(R, [0, 0, 0, 10, 0'{, 0'}], 65536, Got).

test(empty_body_is_declined, [forall((readers(Rs), member(R, Rs))), true(Got == text(""))]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    frame_read(R, [0, 0, 0, 0], 65536, Got).

test(bad_first_byte, [error(type_error(between(0, 255), 256))]) :-
    read_frame_json(user_input, 256, 10, _).

test(the_c_library_is_loaded_when_built) :-
    module_property(cod_frames, file(File)),
    file_directory_name(File, Dir),
    directory_file_path(Dir, '../native/cod_frames.so', Lib),
    (   exists_file(Lib)
    ->  frames_in_c
    ;   true
    ).

%   write_frame/3 by the C library and in Prolog.
written(Reader, Text, Max, Bytes) :-
    new_memory_file(MF),
    setup_call_cleanup(open_memory_file(MF, write, W, [encoding(octet)]),
                       writer_frame(Reader, W, Text, Max), close(W)),
    memory_file_to_codes(MF, Bytes, octet),
    free_memory_file(MF).

writer_frame(c, W, Text, Max) :-
    cod_frames:c_frames,
    write_frame(W, Text, Max).
writer_frame(prolog, W, Text, Max) :-
    cod_frames:prolog_write_frame(W, Text, Max).

test(frame_written, [forall((member(T, ["{}", "{\"a\":\"é€😀\"}", ""]), readers(Rs), member(R, Rs))),
                     true(Got == Want)]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    frame_bytes(T, Want),
    written(R, T, 100, Got).

test(frame_over_the_limit_is_refused_and_not_written, [forall((readers(Rs), member(R, Rs))),
                                                       true(E-Got =@= error(resource_error(cod_reply(11, 10)), _)-[])]) :-
    ( R == c -> cod_frames:c_frames ; true ),
    new_memory_file(MF),
    setup_call_cleanup(open_memory_file(MF, write, W, [encoding(octet)]),
                       catch(writer_frame(R, W, "{\"é\":\"xx\"}", 10), E, true), close(W)),
    memory_file_to_codes(MF, Got, octet),
    free_memory_file(MF).

:- end_tests(cod_frames).
