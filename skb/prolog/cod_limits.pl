/*  COD SKB: running application code under limits it cannot escape.
*/

:- module(cod_limits,
          [ run_limited/3,           % :Goal, +Seconds, +Inferences
            start_watchdog/0,
            cancel_tagged/2,         % +Tag, -Count
            abandon_tagged/2,        % +Tag, -Count
            abandoned/1              % +Tag
          ]).
:- use_module(library(error)).

/** <module> Time and inference limits for application code

The time limit is enforced from outside the query: every limited call
records its deadline (in the recorded database under cod_deadline, which,
unlike dynamic predicates, is not undone or hidden by the snapshot/1 that
queries run in), and one watchdog thread looks at
the table every TICK_S seconds and throws cod_limit(time) in every thread
whose deadline has passed, again at each tick until the call is over.  So:

  - a query costs an assert and an erase, not an alarm: call_with_time_limit/2
    wakes SWI-Prolog's alarm thread twice per call (measured: alarm/4 and
    remove_alarm/1 were a quarter of a trivial query's time, and each is a
    cross-thread wake-up), and a limit is overshot by at most one tick;
  - a query that catches the exception (or runs a long recovery) is
    interrupted again at the next tick, and cod_guard.pl refuses application
    code that could catch cod_limit(_) at all (a catch/3 whose catcher is
    unbound or unifies with a reserved exception) or run cleanup handlers,
    so the first exception that reaches a frame the application did not
    write ends the query.

The inference limit is call_with_inference_limit/3's; its exception
(inference_limit_exceeded) is reserved as well.  The stack limit is the
thread's own (set when the SKB server creates the thread).

Before start_watchdog/0 runs (sync tools that load these files without the
server), limits fall back to an alarm per call.
*/

:- meta_predicate run_limited(0, +, +).

:- dynamic
    watchdog_running/0.

tick_s(0.02).

%!  run_limited(:Goal, +Seconds, +Inferences) is semidet.
%
%   Call Goal as once/1 would, under a wall-clock limit of Seconds and a
%   limit of Inferences.
%
%   @error cod_limit(time) when the time limit is reached.
%   @error resource_error(inferences) (context inference_limit(N)) when
%          the inference limit is reached.
run_limited(Goal, Seconds, Inferences) :-
    must_be(positive_integer, Inferences),
    (   number(Seconds), Seconds > 0, Seconds < inf
    ->  true
    ;   must_be(positive_number, Seconds), domain_error(finite_time_limit, Seconds)
    ),
    (   watchdog_running
    ->  get_time(Now),
        Deadline is Now + Seconds,
        thread_self(Me),
        (   nb_current(cod_tag, Tag) -> true ; Tag = none ),
        setup_call_cleanup(
            recorda(cod_deadline, d(Me, Deadline, Tag), Ref),
            call_with_inference_limit(Goal, Inferences, Result),
            erase(Ref))
    ;   setup_call_cleanup(
            alarm(Seconds, cod_limits:expired_alarm, Alarm, [remove(false)]),
            call_with_inference_limit(Goal, Inferences, Result),
            remove_alarm(Alarm))
    ),
    (   Result == inference_limit_exceeded
    ->  throw(error(resource_error(inferences), inference_limit(Inferences)))
    ;   true
    ).

:- public expired_alarm/0.
expired_alarm :-
    throw(cod_limit(time)).

%!  start_watchdog is det.
%
%   Start the thread that enforces the deadlines (once per process).
start_watchdog :-
    (   watchdog_running
    ->  true
    ;   thread_create(watch, _, [alias(cod_watchdog), detached(true)]),
        assertz(watchdog_running)
    ).

watch :-
    tick_s(Tick),
    repeat,
        sleep(Tick),
        get_time(Now),
        forall(( recorded(cod_deadline, d(Thread, Deadline, _)), Deadline =< Now ),
               catch(thread_signal(Thread, cod_limits:expire(Deadline)), _, true)),
        fail.

%   expire(+Deadline): run in a limited thread by the watchdog.  Throw only
%   if the call that set Deadline is still running (the thread may have
%   finished it and begun another since the watchdog looked).
:- public expire/1.
expire(Deadline) :-
    thread_self(Me),
    (   recorded(cod_deadline, d(Me, Deadline, _))
    ->  throw(cod_limit(time))
    ;   true
    ).

%!  abandon_tagged(+Tag, -Count) is det.
%
%   The client of Tag is gone (its connection closed): its running calls
%   are stopped as by cancel_tagged/2, and Tag is remembered so that its
%   queries still queued are answered at once without running (abandoned/1).
%   Without it, a client that pipelines thousands of queries and leaves
%   keeps the pool busy with answers nobody reads.  Tags are never reused
%   (a connection's token or id); the last MAX_ABANDONED are remembered.
abandon_tagged(Tag, Count) :-
    must_be(atom, Tag),
    (   abandoned_tag(Tag)
    ->  true
    ;   assertz(abandoned_tag(Tag)),
        flag(cod_abandoned, N, N+1),
        (   N >= 10000, retract(abandoned_tag(_))   % the oldest
        ->  flag(cod_abandoned, M, M-1)
        ;   true
        )
    ),
    cancel_tagged(Tag, Count).

:- dynamic abandoned_tag/1.

%!  abandoned(+Tag) is semidet.
%
%   True if the client of Tag is gone (abandon_tagged/2).
abandoned(Tag) :-
    Tag \== none,
    abandoned_tag(Tag), !.

%!  cancel_tagged(+Tag, -Count) is det.
%
%   Stop every limited call running for Tag (set by the caller in the
%   global variable cod_tag: a client's capability token), as if its time
%   limit had passed, with cod_limit(cancelled).  Count calls were running.
cancel_tagged(Tag, Count) :-
    findall(Thread-Deadline, recorded(cod_deadline, d(Thread, Deadline, Tag)), Running),
    forall(member(Thread-Deadline, Running),
           catch(thread_signal(Thread, cod_limits:cancelled(Deadline)), _, true)),
    length(Running, Count).

:- public cancelled/1.
cancelled(Deadline) :-
    thread_self(Me),
    (   recorded(cod_deadline, d(Me, Deadline, _))
    ->  throw(cod_limit(cancelled))
    ;   true
    ).
