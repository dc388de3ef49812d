/*  COD SKB: running application code under limits it cannot escape.
*/

:- module(cod_limits,
          [ run_limited/3,           % :Goal, +Seconds, +Inferences
            with_time_spent/2,       % +Seconds, :Goal
            start_watchdog/0,
            cancel_tagged/2,         % +Tag, -Count
            abandon_tagged/2,        % +Tag, -Count
            abandoned/1              % +Tag
          ]).
:- use_module(library(error)).

/** <module> Time and inference limits for application code

The time limit is enforced from outside the query: every limited call
sets its thread's deadline (and its client's tag) in two flags of that
thread (get_flag/2 and set_flag/2: global, and, unlike dynamic predicates,
not undone or hidden by the snapshot/1 that queries run in; flag/3 is not
used: its update, a Prolog predicate under a mutex, made the watchdog die of
an instantiation error when called inside a snapshot), and one watchdog thread looks at
the flags every TICK_S seconds and throws cod_limit(time) in every thread
whose deadline has passed, again at each tick until the call is over.
(The table was the recorded database: while the watchdog enumerated its key
every tick, SWI-Prolog 9.0 never reclaimed the erased records, about 80
bytes per query: 10 MB per 100,000 queries, the engine's memory growing
without bound under a steady load.)  So:

  - a query costs two flag reads and two writes, not an alarm: call_with_time_limit/2
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

:- meta_predicate
    run_limited(0, +, +),
    with_time_spent(+, 0).

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
        thread_keys(DeadlineKey, TagKey),
        get_flag(DeadlineKey, Outer),
        (   Outer > 0 -> true ; nb_setval(cod_limit_seconds, Seconds) ),  % read by cod_grants.pl
        (   Outer > 0
        ->  Deadline is Now + Seconds
        ;   time_left(Seconds, Left),
            Deadline is Now + Left
        ),
        (   nb_current(cod_tag, Tag) -> true ; Tag = none ),
        get_flag(TagKey, OuterTag),
        (   Outer > 0 -> Effective is min(Outer, Deadline) ; Effective = Deadline ),
        %   The tag means something only while a deadline is set: written when it
        %   changes, given back only to an outer call (each flag write takes a lock).
        (   OuterTag == Tag
        ->  SetTag = true, ResetTag = true
        ;   SetTag = set_flag(TagKey, Tag),
            ( Outer > 0 -> ResetTag = set_flag(TagKey, OuterTag) ; ResetTag = true )
        ),
        setup_call_cleanup(
            ( SetTag, set_flag(DeadlineKey, Effective) ),
            call_with_inference_limit(Goal, Inferences, Result),
            ( set_flag(DeadlineKey, Outer), ResetTag, released(Outer) ))
    ;   time_left(Seconds, Left),
        setup_call_cleanup(
            alarm(Left, cod_limits:expired_alarm, Alarm, [remove(false)]),
            call_with_inference_limit(Goal, Inferences, Result),
            remove_alarm(Alarm))
    ),
    (   Result == inference_limit_exceeded
    ->  throw(error(resource_error(inferences), inference_limit(Inferences)))
    ;   true
    ).

%   released(+Outer): at the end of the outermost limited call, free what
%   the query left in its thread beyond its stacks: tables (0.1 us when
%   there are none).  cod_guard.pl refuses tabling to application code;
%   this is the layer below, should a tabled goal ever pass the check.
released(Outer) :-
    (   Outer > 0
    ->  true
    ;   catch(abolish_private_tables, _, true)
    ).

%!  with_time_spent(+Spent, :Goal) is semidet.
%
%   Call Goal as once/1 would, with Spent seconds already spent of the time
%   limit of each limited call it makes outside any other (run_limited/3):
%   work made again after a first run (under a large stack grant,
%   cod_grants.pl) gets what its first run and its wait left, not its whole
%   limit again.  A limit already spent ends the call at once.
with_time_spent(Spent, Goal) :-
    must_be(number, Spent),
    (   Spent >= 0 -> true ; domain_error(not_less_than_zero, Spent) ),
    setup_call_cleanup(nb_setval(cod_time_spent, Spent),
                       once(Goal),
                       nb_setval(cod_time_spent, 0)).

%   time_left(+Seconds, -Left): Seconds less the time spent before this run
%   (with_time_spent/2); throws cod_limit(time) when none is left.
time_left(Seconds, Left) :-
    (   nb_current(cod_time_spent, Spent), Spent > 0
    ->  Left is Seconds - Spent,
        (   Left > 0 -> true ; throw(cod_limit(time)) )
    ;   Left = Seconds
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
        forall(( running(Thread, Deadline, _), Deadline =< Now ),
               catch(thread_signal(Thread, cod_limits:expire(Deadline)), _, true)),
        fail.

%   thread_keys(-DeadlineKey, -TagKey): the calling thread's two flags, named by its
%   thread id.  Ids are small and reused, so there are as many flags as threads were
%   alive at once; the largest id that ever ran a limited call is kept in a flag too,
%   and the watchdog reads the flags of ids 1 to it (flags cannot be enumerated).
%   A deadline of 0 means no limited call runs there.
thread_keys(DeadlineKey, TagKey) :-
    (   nb_current(cod_deadline_keys, DeadlineKey-TagKey)   % made once per thread
    ->  true
    ;   thread_self(Me),
        thread_property(Me, id(Id)),
        id_keys(Id, DeadlineKey, TagKey),
        set_flag(DeadlineKey, 0),       % a dead thread with this id may have left its deadline
        with_mutex(cod_limits_ids,
                   (   get_flag(cod_deadline_max_id, Max),
                       (   Id > Max -> set_flag(cod_deadline_max_id, Id) ; true )
                   )),
        nb_setval(cod_deadline_keys, DeadlineKey-TagKey)
    ).

id_keys(Id, DeadlineKey, TagKey) :-
    atom_concat(cod_deadline_, Id, DeadlineKey),
    atom_concat(cod_deadline_tag_, Id, TagKey).

%   running(-ThreadId, -Deadline, -Tag): a thread running a limited call, its deadline
%   (the earliest of its nested calls') and its client's tag.
running(Id, Deadline, Tag) :-
    id_table(Table),
    member(k(Id, DeadlineKey, TagKey), Table),
    get_flag(DeadlineKey, Deadline),
    Deadline > 0,
    get_flag(TagKey, Tag).

%   id_table(-Table): k(Id, DeadlineKey, TagKey) for ids 1 to the largest, built again
%   (in the calling thread's global variable) only when that grows.
id_table(Table) :-
    get_flag(cod_deadline_max_id, Max),
    (   nb_current(cod_deadline_table, Max-Table)
    ->  true
    ;   findall(k(Id, D, T), ( between(1, Max, Id), id_keys(Id, D, T) ), Table),
        nb_setval(cod_deadline_table, Max-Table)
    ).

%   still_running(+Deadline): the calling thread's limited call that set Deadline has not
%   returned (the thread may have finished it and begun another since the watchdog looked).
still_running(Deadline) :-
    thread_keys(DeadlineKey, _),
    get_flag(DeadlineKey, Current),
    Current =:= Deadline.

%   expire(+Deadline): run in a limited thread by the watchdog.  Throw only
%   if the call that set Deadline is still running.
:- public expire/1.
expire(Deadline) :-
    (   still_running(Deadline)
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
    findall(Thread-Deadline, running(Thread, Deadline, Tag), Running),
    forall(member(Thread-Deadline, Running),
           catch(thread_signal(Thread, cod_limits:cancelled(Deadline)), _, true)),
    length(Running, Count).

:- public cancelled/1.
cancelled(Deadline) :-
    (   still_running(Deadline)
    ->  throw(cod_limit(cancelled))
    ;   true
    ).
