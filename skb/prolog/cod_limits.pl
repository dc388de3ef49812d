/*  COD SKB: running application code under limits it cannot escape.
*/

:- module(cod_limits,
          [ run_limited/3            % :Goal, +Seconds, +Inferences
          ]).
:- use_module(library(error)).
:- use_module(library(time)).

/** <module> Time and inference limits for application code

call_with_time_limit/2 fires its alarm once: a goal that catches
time_limit_exceeded (or runs a long recovery or cleanup goal) escapes it,
and the engine had to be restarted to get the thread back.  Here the limit
is enforced by an alarm that keeps firing every RETRY_S seconds until the
goal is over, throwing cod_limit(time) each time, and cod_guard.pl refuses
application code that could catch cod_limit(_) (a catch/3 whose catcher is
unbound or unifies with a reserved exception) or run cleanup handlers.  So
the first exception that reaches a frame the application did not write
ends the query.

The inference limit is call_with_inference_limit/3's; its exception
(inference_limit_exceeded) is reserved as well.  The stack limit is the
thread's own (set when the SKB server creates the thread).
*/

:- meta_predicate run_limited(0, +, +).

:- thread_local active_limit/1.

retry_s(0.05).

%!  run_limited(:Goal, +Seconds, +Inferences) is semidet.
%
%   Call Goal once... as call/1 would, under a wall-clock limit of Seconds
%   and a limit of Inferences.
%
%   @error cod_limit(time) when the time limit is reached.
%   @error resource_error(inferences) (context inference_limit(N)) when
%          the inference limit is reached.
run_limited(Goal, Seconds, Inferences) :-
    must_be(positive_integer, Inferences),
    (   number(Seconds), Seconds > 0, Seconds =:= Seconds, Seconds < inf
    ->  true
    ;   must_be(positive_number, Seconds), domain_error(finite_time_limit, Seconds)
    ),
    flag(cod_limit_id, Id, Id+1),
    setup_call_cleanup(
        arm(Id, Seconds, Alarm),
        call_with_inference_limit(Goal, Inferences, Result),
        disarm(Id, Alarm)),
    (   Result == inference_limit_exceeded
    ->  throw(error(resource_error(inferences), inference_limit(Inferences)))
    ;   true
    ).

arm(Id, Seconds, Alarm) :-
    asserta(active_limit(Id)),
    alarm(Seconds, cod_limits:expire(Id), Alarm, [remove(false)]).

disarm(Id, Alarm) :-
    retractall(active_limit(Id)),
    remove_alarm(Alarm).

%   expire(+Id): the alarm of limit Id fired in the limited thread.  While
%   the limited goal runs, throw, and fire again soon in case the goal's
%   code swallowed it.  Alarms that fire after the goal is over do nothing.
:- public expire/1.
expire(Id) :-
    (   active_limit(Id)
    ->  retry_s(Retry),
        alarm(Retry, cod_limits:expire(Id), _, [remove(true)]),
        throw(cod_limit(time))
    ;   true
    ).
