/*  plunit tests of the query pool: a worker that dies for any reason is
    counted out, its job answered and its slots released; a pool that
    stops serving is noticed.
*/
:- begin_tests(cod_pool).

:- use_module(cod_pool).

:- dynamic answered/2, started/2.

%   A worker ended by each way a thread can end (issue 23, item 3: 64
%   connections throwing '$aborted' 5 times each killed every worker, and
%   all reads of every uid stopped for good).
test(a_dead_worker_is_counted_out_and_its_slots_released,
     [ forall(member(Death, [abort, exit, throw(boom), throw('$aborted'),
                             throw(error(resource_error(memory), _))])),
       setup(fresh_pool([max_threads(4), min_workers(0), app_slots(1), uid_threads(1)])),
       cleanup(drain_pool) ]) :-
    Client = client(1000, false),
    request_slot(victim, Client, job(1, block, victim, Client)),
    started_worker(1, Worker),
    kill(Death, Worker),
    wait_for(answered(1, died(_))),
    pool_stats(Stats),
    assertion(memberchk(workers-0, Stats)),
    assertion(memberchk(unprivileged-0, Stats)),
    assertion(\+ cod_pool:pool_worker(Worker)),
    % The same application and uid (one slot each) are served again.
    request_slot(victim, Client, job(2, answer, victim, Client)),
    wait_for(answered(2, done)),
    assertion(pool_health(ok)).

%   Every worker dies at once, many times over: the pool keeps serving.
test(the_pool_serves_after_every_worker_died_many_times,
     [ setup(fresh_pool([max_threads(8), min_workers(0)])),
       cleanup(drain_pool) ]) :-
    forall(between(1, 10, Round),
           (   Base is Round * 100,
               forall(between(1, 8, K),
                      ( Id is Base + K, submit(job(Id, block, none, none)) )),
               forall(between(1, 8, K),
                      ( Id is Base + K, started_worker(Id, W), kill(abort, W) )),
               forall(between(1, 8, K),
                      ( Id is Base + K, wait_for(answered(Id, died(_))) ))
           )),
    submit(job(2000, answer, none, none)),
    wait_for(answered(2000, done)),
    pool_stats(Stats),
    assertion(memberchk(backlog-0, Stats)).

%   A worker killed while it waits for a job it was reserved for leaves
%   that job to a new worker.
test(a_worker_killed_while_waiting_leaves_no_job_behind,
     [ setup(fresh_pool([max_threads(2), min_workers(0), worker_idle_s(60)])),
       cleanup(drain_pool) ]) :-
    submit(job(1, answer, none, none)),
    wait_for(answered(1, done)),
    once(cod_pool:pool_worker(W)),
    kill(abort, W),
    wait_for(\+ cod_pool:pool_worker(W)),
    submit(job(2, answer, none, none)),
    wait_for(answered(2, done)).

%   The health check sees a pool that stopped serving (issue 23: the
%   engine answered pings while no read was served): a worker counted
%   but gone, or jobs queued and none taken for pool_stall_s.
test(health_sees_a_worker_counted_but_gone,
     [ setup(fresh_pool([])), cleanup((retractall(cod_pool:pool_worker(_)), drain_pool)) ]) :-
    thread_create(true, Gone, []),
    thread_join(Gone, _),
    assertz(cod_pool:pool_worker(Gone)),
    pool_health(Health),
    assertion(Health = stopped(dead_workers(_))).

test(health_sees_a_stalled_pool,
     [ setup(fresh_pool([max_threads(1), min_workers(0), pool_stall_s(0.3)])),
       cleanup(drain_pool) ]) :-
    assertion(pool_health(ok)),
    submit(job(1, block, none, none)),
    started_worker(1, _),
    submit(job(2, answer, none, none)),       % waits: the only worker is stuck
    sleep(0.5),
    pool_health(Health),
    assertion(Health = stopped(stalled(_, _))).

%   Per-uid shares: one unprivileged uid runs at most uid_threads queries
%   at once, unprivileged uids together leave the reserve to privileged
%   ones, and the excess waits its turn (nothing is refused).
test(one_uid_gets_its_share_and_privileged_clients_their_reserve,
     [ setup(fresh_pool([max_threads(6), reserved_privileged_threads(2), uid_threads(2),
                         app_slots(10)])),
       cleanup(drain_pool) ]) :-
    forall(between(1, 3, Uid),
           forall(between(1, 3, K),
                  ( Id is Uid * 10 + K, C = client(Uid, false),
                    request_slot(app, C, job(Id, block, app, C)) ))),
    wait_for(aggregate_all(count, started(_, _), 4)),
    sleep(0.2),
    aggregate_all(count, started(_, _), Running),
    assertion(Running == 4),                  % max_threads - reserve
    forall(between(1, 3, Uid),
           ( aggregate_all(count, ( started(Id, _), Id // 10 =:= Uid ), N),
             assertion(N =< 2) )),
    Root = client(0, true),
    request_slot(app, Root, job(100, answer, app, Root)),
    wait_for(answered(100, done)),
    Daemon = client(daemon, true),
    request_slot(app, Daemon, job(101, answer, app, Daemon)),
    wait_for(answered(101, done)),
    findall(Id, ( between(1, 3, Uid), between(1, 3, K), Id is Uid * 10 + K ), Ids),
    release_all(Ids).

		 /*******************************
		 *           HELPERS            *
		 *******************************/

fresh_pool(Options) :-
    drain_pool,
    retractall(answered(_, _)),
    retractall(started(_, _)),
    pool_init([ run(plunit_cod_pool:run_job), died(plunit_cod_pool:job_died),
                worker_idle_s(0.1), stack_limit(16777216) | Options ]).

%   drain_pool: end every worker of an earlier test.
drain_pool :-
    forall(started(_, T), catch(thread_send_message(T, go), _, true)),
    forall(cod_pool:pool_worker(T), catch(thread_signal(T, abort), _, true)),
    wait_for(\+ cod_pool:pool_worker(_)),
    retractall(cod_pool:parked(_, _, _, _)),
    retractall(cod_pool:running(_, _)),
    retractall(cod_pool:uid_running(_, _)),
    retractall(cod_pool:busy_app(_, _)),
    (   catch(message_queue_destroy(cod_jobs), _, true) -> true ; true ).

:- public run_job/2, job_died/2.
run_job(Id, answer) :-
    assertz(answered(Id, done)).
run_job(Id, block) :-
    thread_self(Me),
    assertz(started(Id, Me)),
    thread_get_message(go),
    assertz(answered(Id, done)).
run_job(_, die(E)) :-
    throw(E).

job_died(Id, Status) :-
    assertz(answered(Id, died(Status))).

%   release_all(+Ids): let every blocked job go, those that start later too.
release_all(Ids) :-
    wait_for(( forall(( started(Id, T), \+ answered(Id, _) ), thread_send_message(T, go)),
               forall(member(Id, Ids), answered(Id, _)) )).

started_worker(Id, Worker) :-
    wait_for(started(Id, _)),
    once(started(Id, Worker)).

%   kill(+How, +Thread): end a worker as a bug or an attacker could.
kill(abort, T) :- thread_signal(T, abort).
kill(exit, T) :- thread_signal(T, thread_exit(killed)).
kill(throw(E), T) :- thread_signal(T, throw(E)).

wait_for(Goal) :-
    between(1, 500, _),
    (   call(Goal) -> ! ; sleep(0.01), fail ), !.
wait_for(Goal) :-
    format(user_error, "timed out waiting for ~q~n", [Goal]),
    fail.

:- end_tests(cod_pool).
