:- module(cod_test_escape, [escape_shell/2, escape_write/2, escape_loader/2, escape_stderr/1,
                            escape_reply_line/1]).

/** <module> A deliberate escape from the sandbox, for tests only

Loaded as a trusted stored-procedure library only by tests/skb/test_skb_lockdown.py
(through EngineConfig.library_dir), never by the daemon: these predicates
run whatever an application asks, unchecked, inside the engine, to show
what the engine's process may still do once its sandbox is escaped.
*/

:- use_module(library(process)).

%!  escape_shell(+Command:text, -Status) is det.
%   shell/2 outside the sandbox; Status is its exit status or the error term as text.
escape_shell(Command, Status) :-
    catch(shell(Command, Status0), E, true),
    outcome(E, Status0, Status).

%!  escape_write(+File:text, -Result) is det.
%   Create File and write to it; Result is `ok` or the error as text.
escape_write(File, Result) :-
    catch(setup_call_cleanup(open(File, write, S), write(S, escaped), close(S)), E, true),
    outcome(E, ok, Result).

%!  escape_loader(+Argv:list, -Result) is det.
%   Run a program through the ELF interpreter (what Landlock alone cannot refuse).
escape_loader([Exe|Args], Result) :-
    catch(( process_create(Exe, Args, [process(Pid)]),
            process_wait(Pid, Status) ), E, true),
    outcome(E, Status, Result).

%!  escape_stderr(+N) is det.
%   Write N lines to the engine's own standard error (file descriptor 2).
escape_stderr(N) :-
    stream_property(S, file_no(2)),
    forall(between(1, N, I), format(S, "flood ~d~n", [I])),
    flush_output(S).

%!  escape_reply_line(+Text) is det.
%   Write Text as a line of the control channel, as a broken engine would.
escape_reply_line(Text) :-
    cod_server:protocol_out(Out),
    with_mutex(cod_out, ( write(Out, Text), nl(Out), flush_output(Out) )).

outcome(E, _, Result) :-
    nonvar(E), !,
    format(string(Result), "~q", [E]).
outcome(_, Value, Result) :-
    format(string(Result), "~q", [Value]).
