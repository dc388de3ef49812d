/*  COD SKB: the direct channel's frames, in C when built.
*/

:- module(cod_frames,
          [ read_frame_json/4,       % +In, +B0, +MaxBytes, -Frame
            write_frame/3,           % +Out, +Text, +MaxBytes
            frames_in_c/0
          ]).
:- use_module(library(error)).
:- use_module(cod_fastjson).

/** <module> Frames of the direct channel

A frame is a 4-byte big-endian length, then that many bytes of UTF-8
JSON (docs/protocol.md).  Reading a request frame and turning its JSON
into a dict cost the engine ~15 us of CPU in Prolog, a third of a
single-fact query's; skb/native/cod_frames.c does it with one read and
one jansson parse, and writes a reply's frame without making a byte list
of it (docs/design-rm.md, "The frames in C").  `make setup`
builds that library; without it (an install by pip alone) the same
predicates run in Prolog, with the same results.

Both readers return a dict only for text on which they agree with
library(http/json); anything else they leave to it as text(Body).
*/

:- dynamic c_frames/0.

%   The foreign library, when built: where COD_FRAMES_LIBRARY says (the
%   daemon's engine reaches it through a descriptor, skb/lifecycle.py),
%   else in ../native beside this directory (swipl run in the repository).
load_c_frames :-
    (   getenv('COD_FRAMES_LIBRARY', Lib)
    ->  true
    ;   prolog_load_context(directory, Dir),
        directory_file_path(Dir, '../native/cod_frames.so', Lib)
    ),
    (   exists_file(Lib),
        catch(load_foreign_library(Lib), E,
              ( print_message(warning, E), fail )),
        current_predicate(cod_read_frame/4),     % not a library without them
        current_predicate(cod_write_frame/4)
    ->  assertz(c_frames)
    ;   true
    ).

:- initialization(load_c_frames, now).

%!  frames_in_c is semidet.
%
%   True when the frames are read and written by the foreign library.
frames_in_c :-
    c_frames.

%!  read_frame_json(+In, +B0, +MaxBytes, -Frame) is det.
%
%   Read the rest of a frame whose first header byte B0 was read from the
%   binary stream In.  Frame is json(Dict) for a body read as a JSON
%   object, text(Body) for a body left to library(http/json) (Body: its
%   UTF-8 text), too_big(Size) when the header announces more than
%   MaxBytes (the body is not read), or closed when In ends inside the
%   frame.  Errors of In (a timeout) are raised.
read_frame_json(In, B0, Max, Frame) :-
    must_be(between(0, 255), B0),
    must_be(nonneg, Max),
    (   c_frames
    ->  cod_read_frame(In, B0, Max, Frame0),
        c_frame(Frame0, Frame)
    ;   prolog_frame(In, B0, Max, Frame)
    ).

c_frame(dict(Dict), json(Dict)).
c_frame(raw(Raw), text(Body)) :-
    utf8_text(Raw, Body).
c_frame(too_big(Size), too_big(Size)).
c_frame(closed, closed).

prolog_frame(In, B0, Max, Frame) :-
    get_byte(In, B1), get_byte(In, B2), get_byte(In, B3),
    (   memberchk(-1, [B1, B2, B3])
    ->  Frame = closed
    ;   Size is (B0 << 24) \/ (B1 << 16) \/ (B2 << 8) \/ B3,
        (   Size > Max
        ->  Frame = too_big(Size)
        ;   read_string(In, Size, Raw),
            string_length(Raw, Got),
            (   Got < Size
            ->  Frame = closed
            ;   utf8_text(Raw, Body),
                (   fast_json_dict(Body, Dict)
                ->  Frame = json(Dict)
                ;   Frame = text(Body)
                )
            )
        )
    ).

%   utf8_text(+Raw, -Text): Raw holds one byte per character (read from a
%   binary stream); Text is those bytes decoded from UTF-8 in C
%   (string_bytes/3).  The byte list costs 24 bytes of stack per byte:
%   24 MB for a frame at the 1 MiB limit, under the 256 MiB stack.
utf8_text(Raw, Text) :-
    string_codes(Raw, Bytes),
    string_bytes(Text, Bytes, utf8).

%!  write_frame(+Out, +Text, +MaxBytes) is det.
%
%   Write Text as one frame to the binary stream Out, and flush it.
%   @error resource_error(cod_reply(Size, MaxBytes)) when Text is more
%          than MaxBytes in UTF-8; nothing is written then.
write_frame(Out, Text, Max) :-
    (   c_frames
    ->  cod_write_frame(Out, Text, Max, Size),
        (   Size > Max
        ->  throw(error(resource_error(cod_reply(Size, Max)), _))
        ;   true
        )
    ;   prolog_write_frame(Out, Text, Max)
    ).

prolog_write_frame(Out, Text, Max) :-
    string_bytes(Text, Bytes, utf8),
    length(Bytes, Size),
    (   Size > Max
    ->  throw(error(resource_error(cod_reply(Size, Max)), _))
    ;   true
    ),
    B0 is (Size >> 24) /\ 0xff, B1 is (Size >> 16) /\ 0xff,
    B2 is (Size >> 8) /\ 0xff, B3 is Size /\ 0xff,
    format(Out, "~s", [[B0, B1, B2, B3|Bytes]]),
    flush_output(Out).
