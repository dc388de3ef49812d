/*  COD SKB server: the query pool and its slots.
*/

:- module(cod_pool,
          [ pool_init/1,             % +Options
            pool_default/2,          % ?Name, ?Default
            request_slot/3,          % +App, +Client, +Job
            submit/1,                % +Job
            with_app_slot/3,         % +App, +Client, :Goal
            app_busy/1,              % +App
            pool_stats/1,            % -Pairs
            pool_health/1            % -Health
          ]).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(option)).
:- use_module(cod_grants, [client_thread_options/1]).

/** <module> Who runs a query, and when

Jobs: job(Id, Op, App, Client).  App is the application whose slot the job
holds (or `none`, a read of the Resource Manager's own); Client is whom it
runs for: client(Uid, Privileged), where Privileged is true for root and
the daemon's own user (the Resource Manager says which; a job that names
nobody is the daemon's).

Slots (both channels together, counted under the cod_slots mutex, in
flags: slot_key/3):

  - at most app_slots queries of one application run at once;
  - at most uid_threads queries of one unprivileged uid run at once, over
    all its applications;
  - unprivileged uids together run at most max_threads -
    reserved_privileged_threads queries (the reserve being at most half of
    max_threads): the rest is kept for root and the daemon, so that no
    number of uids can make their queries wait.

A query that may not run yet waits in one FIFO (parked/4) and is started by
the release of a slot that lets it run; nothing is refused.

The pool (the cod_pool mutex): a worker is reserved for each job when it
is queued (cod_idle counts only the waiting workers that no queued job has
taken), so a burst of N jobs finds N workers, however slowly the workers
wake up; the pool grows up to max_threads and shrinks back to min_workers
after worker_idle_s.  A worker that dies, for whatever reason (an
exception that escapes, an abort, a resource error, a killed thread), is
counted out of the pool by its exit hook, its job is answered with an
error, its slots are released, and a job it leaves without a worker gets
a new one.  pool_health/1 tells whether the pool still serves (the
engine's `ping` answers with it).
*/

:- meta_predicate with_app_slot(+, +, 0).

:- dynamic
    pool_option/2,         % Name, Value
    parked/4,              % Seq, App, Client, Job: waiting for slots
    pool_worker/1.         % Thread: a live worker

%!  pool_default(?Name, ?Default) is nondet.
%
%   The pool's settings and their defaults: the options of pool_init/1,
%   and the SKB server's command-line settings of the same names.
pool_default(app_slots, 4).                     % queries of one application running at once
pool_default(uid_threads, 16).                  % queries of one unprivileged uid running at once
pool_default(reserved_privileged_threads, 32).  % of max_threads, only for root and the daemon
pool_default(max_threads, 256).
pool_default(min_workers, 4).                   % the pool never shrinks below this
pool_default(worker_idle_s, 10).                % an idle worker beyond min_workers leaves after this
pool_default(pool_stall_s, 15).                 % queued jobs and none taken for this long: ping fails

%!  pool_init(+Options) is det.
%
%   Options: run(:Closure), called as call(Closure, Id, Op) to run and
%   answer a job; died(:Closure), called as call(Closure, Id, Reason)
%   when the worker running job Id ended before answering it; and the
%   settings of pool_default/2.
pool_init(Options) :-
    must_be(list, Options),
    retractall(pool_option(_, _)),
    forall(pool_default(Name, Default),
           (   Opt =.. [Name, Value],
               option(Opt, Options, Default),
               assertz(pool_option(Name, Value))
           )),
    option(run(Run), Options),
    option(died(Died), Options),
    assertz(pool_option(run, Run)),
    assertz(pool_option(died, Died)),
    (   catch(message_queue_property(cod_jobs, size(_)), _, fail)
    ->  true
    ;   message_queue_create(_, [alias(cod_jobs)])
    ),
    forall(member(F, [cod_workers, cod_idle, cod_backlog, cod_workers_peak, cod_unprivileged]),
           flag(F, _, 0)),
    get_time(Now),
    nb_setval(cod_pool_t0, Now),
    flag(cod_last_take, _, Now).

		 /*******************************
		 *            SLOTS             *
		 *******************************/

%!  request_slot(+App, +Client, +Job) is det.
%
%   Run Job when App and Client have a free slot; until then it waits in
%   the FIFO, and other applications and uids are not affected.
request_slot(App, Client, Job) :-
    with_mutex(cod_slots,
               (   take_slot(App, Client)
               ->  Ready = true
               ;   park(App, Client, Job),
                   Ready = false
               )),
    (   Ready == true -> submit(Job) ; true ).

take_slot(App, Client) :-
    pool_option(app_slots, MaxApp),
    slot_key(app, App, AppKey),
    get_flag(AppKey, N0),
    N0 < MaxApp,
    (   Client = client(Uid, false)
    ->  pool_option(uid_threads, MaxUid),
        slot_key(uid, Uid, UidKey),
        get_flag(UidKey, U0),
        U0 < MaxUid,
        unprivileged_ceiling(MaxAll),
        get_flag(cod_unprivileged, A0),
        A0 < MaxAll,
        U1 is U0 + 1, set_flag(UidKey, U1),
        A1 is A0 + 1, set_flag(cod_unprivileged, A1)
    ;   true
    ),
    N1 is N0 + 1,
    set_flag(AppKey, N1).

%   The reserve is at most half of the pool, so that a small pool still
%   serves unprivileged uids.
unprivileged_ceiling(Max) :-
    pool_option(max_threads, T),
    pool_option(reserved_privileged_threads, R),
    Max is max(1, T - min(R, T // 2)).

%   A count never goes below 0 (as the asserted counters did before).
give_back(App, Client) :-
    slot_key(app, App, AppKey),
    get_flag(AppKey, N0), N1 is max(0, N0 - 1), set_flag(AppKey, N1),
    (   Client = client(Uid, false)
    ->  slot_key(uid, Uid, UidKey),
        get_flag(UidKey, U0), U1 is max(0, U0 - 1), set_flag(UidKey, U1),
        get_flag(cod_unprivileged, A0), A1 is A0 - 1, set_flag(cod_unprivileged, A1)
    ;   true
    ).

%   slot_key(+Kind, +Name, -Key): the flag that counts the queries running
%   now of application Name (Kind app) or of unprivileged uid Name (Kind
%   uid).  Flags, not asserted counters: a query takes and gives back its
%   slot with four flag accesses instead of eight clause changes (each of
%   which every thread's clause garbage collection then visits;
%   docs/design-rm.md, "Where the microseconds go").  Read and written
%   under the cod_slots mutex only.  A flag is never removed: one stays,
%   at 0, for each application name and uid that ever ran a query (a few
%   dozen bytes each).
slot_key(app, App, Key) :-
    atom_concat('cod_slots app ', App, Key).
slot_key(uid, Uid, Key) :-
    atom_concat('cod_slots uid ', Uid, Key).

park(App, Client, Job) :-
    flag(cod_park_seq, Seq, Seq+1),
    assertz(parked(Seq, App, Client, Job)).

%   release_slot(+App, +Client): one query of App for Client is over.
%   Every waiting job that may run now gets its slots, oldest first.
release_slot(App, Client) :-
    with_mutex(cod_slots,
               ( give_back(App, Client),
                 findall(Job, next_runnable(Job), Jobs) )),
    maplist(resume, Jobs).

next_runnable(Job) :-
    parked(Seq, App, Client, Job),
    take_slot(App, Client),
    retract(parked(Seq, App, Client, Job)).

resume(wake(Thread)) :- !,
    catch(thread_send_message(Thread, cod_slot), _, true).
resume(Job) :-
    submit(Job).

%!  app_busy(+App) is semidet.
%
%   App has a query running (call under the cod_slots mutex).  Only an
%   atom names an application that can hold a slot (dispatch/3 and
%   grant_token/3 check it), so anything else is not busy.
app_busy(App) :-
    atom(App),
    slot_key(app, App, Key),
    get_flag(Key, N),
    N > 0.

%!  with_app_slot(+App, +Client, :Goal)
%
%   Run Goal (application code of App, from a direct connection's thread)
%   once App and Client have a free slot, waiting in the FIFO otherwise.
%   A thread stopped while it waits (a revoked capability) leaves no
%   parked entry and no slot behind.
with_app_slot(App, Client, Goal) :-
    thread_self(Me),
    with_mutex(cod_slots,
               (   take_slot(App, Client)
               ->  Wait = false
               ;   park(App, Client, wake(Me)),
                   Wait = true
               )),
    (   Wait == true
    ->  catch(thread_get_message(Me, cod_slot), E,
              ( stop_waiting(App, Client, Me), throw(E) ))
    ;   true
    ),
    setup_call_cleanup(true, Goal, release_slot(App, Client)).

stop_waiting(App, Client, Me) :-
    with_mutex(cod_slots,
               (   retract(parked(_, App, Client, wake(Me)))
               ->  Granted = false
               ;   Granted = true          % released to us meanwhile
               )),
    (   Granted == true -> release_slot(App, Client) ; true ).

		 /*******************************
		 *           THE POOL           *
		 *******************************/

%!  submit(+Job) is det.
%
%   Hand a job to the pool with a worker reserved for it: a waiting one,
%   else a new one, else (at max_threads) the next that finishes a job.
submit(Job) :-
    with_mutex(cod_pool, ( reserve_worker, thread_send_message(cod_jobs, Job) )).

reserve_worker :-
    (   flag(cod_idle, I, I), I > 0
    ->  flag(cod_idle, I1, I1-1)
    ;   add_worker
    ->  true
    ;   flag(cod_backlog, B, B+1)
    ).

%   add_worker: a new worker, reserved (under the cod_pool mutex).
add_worker :-
    flag(cod_workers, T, T),
    pool_option(max_threads, Max),
    T < Max,
    client_thread_options(ThreadOptions),
    catch(thread_create(worker_start, Id,
                        [ detached(true), at_exit(cod_pool:worker_exit)
                        | ThreadOptions ]),
          _, fail),
    assertz(pool_worker(Id)),
    flag(cod_workers, T1, T1+1),
    flag(cod_workers_peak, P, max(P, T1+1)).

worker_start :-
    nb_setval(cod_worker_state, waiting),
    worker_loop.

%   A worker left idle for worker_idle_s seconds leaves, unless it is one
%   of the last min_workers: after a burst of clients the pool shrinks
%   back, because every thread costs every write (clause garbage
%   collection visits each thread) and memory.
worker_loop :-
    pool_option(worker_idle_s, Idle),
    (   thread_get_message(cod_jobs, Job, [timeout(Idle)])
    ->  run_job(Job),
        with_mutex(cod_pool, ( job_done, nb_setval(cod_worker_state, waiting) )),
        worker_loop
    ;   with_mutex(cod_pool, leave_pool)
    ->  nb_setval(cod_worker_state, left)
    ;   worker_loop
    ).

run_job(job(Id, Op, App, Client)) :-
    nb_setval(cod_worker_state, busy(Id, App, Client)),
    (   Client = client(_, _) -> nb_setval(cod_client, Client) ; nb_setval(cod_client, client(daemon, true)) ),
    get_time(Now),
    flag(cod_last_take, _, Now),
    pool_option(run, Run),
    once(call(Run, Id, Op)),   % no choice point may survive a job (the loop would keep its frame)
    nb_setval(cod_worker_state, releasing(App, Client)),
    (   App == none -> true ; release_slot(App, Client) ),
    nb_setval(cod_worker_state, done).
run_job(probe(_)) :-
    get_time(Now),
    flag(cod_last_take, _, Now).

%   job_done: this worker waits again; a job queued without a worker
%   (at max_threads) takes it at once.
job_done :-
    (   flag(cod_backlog, B, B), B > 0
    ->  flag(cod_backlog, B1, B1-1)
    ;   flag(cod_idle, I, I+1)
    ).

%   leave_pool: succeeds (and counts this worker out) when it is not
%   reserved for a queued job and more than min_workers would be left.
leave_pool :-
    flag(cod_idle, I, I), I > 0,
    flag(cod_workers, Total, Total),
    pool_option(min_workers, Min),
    Total > Min,
    flag(cod_workers, T, T-1),
    flag(cod_idle, I1, I1-1),
    thread_self(Me),
    retractall(pool_worker(Me)).

%   worker_exit: the thread's exit hook.  A worker that did not leave
%   through leave_pool/0 died: count it out, answer its job, release its
%   slots, and give a job it was reserved for another worker.
:- public worker_exit/0.
worker_exit :-
    (   nb_current(cod_worker_state, State) -> true ; State = waiting ),
    (   State == left
    ->  true
    ;   thread_self(Me),
        (   thread_property(Me, status(Status)) -> true ; Status = unknown ),
        with_mutex(cod_pool, died_uncounted(Me, State)),
        died_job(State, Status)
    ).

died_uncounted(Me, State) :-
    retractall(pool_worker(Me)),
    flag(cod_workers, T, T-1),
    (   State == waiting
    ->  (   flag(cod_idle, I, I), I > 0
        ->  flag(cod_idle, I1, I1-1)
        ;   flag(cod_backlog, B, B+1)     % it was reserved for a queued job
        )
    ;   true
    ),
    (   flag(cod_backlog, B2, B2), B2 > 0, add_worker
    ->  flag(cod_backlog, B3, B3-1)
    ;   true
    ).

died_job(busy(Id, App, Client), Status) :- !,
    pool_option(died, Died),
    catch(call(Died, Id, Status), _, true),
    (   App == none -> true ; release_slot(App, Client) ).
died_job(releasing(App, Client), _) :- !,
    (   App == none -> true ; release_slot(App, Client) ).
died_job(_, _).

		 /*******************************
		 *      ACCOUNTING, HEALTH      *
		 *******************************/

%!  pool_stats(-Pairs) is det.
%
%   workers, idle (waiting and not reserved), backlog (queued jobs with
%   no worker), peak_workers, parked (jobs waiting for slots),
%   unprivileged (queries of unprivileged uids running).
pool_stats([workers-W, idle-I, backlog-B, peak_workers-P, parked-K, unprivileged-U]) :-
    flag(cod_workers, W, W),
    flag(cod_idle, I, I),
    flag(cod_backlog, B, B),
    flag(cod_workers_peak, P, P),
    flag(cod_unprivileged, U, U),
    aggregate_all(count, parked(_, _, _, _), K).

%!  pool_health(-Health) is det.
%
%   ok, or why the pool no longer serves: stopped(Why).  A worker the
%   accounting counts that is gone (its death was missed), or jobs
%   queued while no worker took any for pool_stall_s seconds.  A probe
%   job is queued too, so that a stalled pool shows at the next check
%   even when nothing else is asked of it.
pool_health(Health) :-
    with_mutex(cod_pool, health(Health)).

health(stopped(dead_workers(Dead))) :-
    findall(T, ( pool_worker(T), \+ alive(T) ), Dead),
    Dead \== [], !.
health(stopped(stalled(Queued, Seconds))) :-
    message_queue_property(cod_jobs, size(Queued)),
    Queued > 0,
    flag(cod_last_take, Last, Last),
    get_time(Now),
    Seconds is Now - Last,
    pool_option(pool_stall_s, Max),
    Seconds > Max, !.
health(ok) :-
    message_queue_property(cod_jobs, size(Queued)),
    (   Queued == 0
    ->  get_time(Now),
        flag(cod_last_take, _, Now),
        reserve_worker,
        thread_send_message(cod_jobs, probe(Now))
    ;   true
    ).

alive(T) :-
    catch(thread_property(T, status(running)), _, fail).
