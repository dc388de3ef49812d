/*  COD SKB: how much stack the running queries may hold, together.
*/

:- module(cod_grants,
          [ grants_init/1,           % +Options
            with_stack_grant/3,      % :Make, :Use, :Refused
            ensure_stack_room/1,     % +Bytes
            trim_thread_stacks/0,
            outgrew_stacks/1,        % +Error
            outgrown/2,              % +Error, -Bool
            grant_default/2,         % ?Name, ?Default
            client_thread_options/1, % -Options
            grant_stats/1            % -Pairs
          ]).
:- use_module(library(error)).
:- use_module(library(option)).
:- use_module(library(aggregate)).
:- use_module(library(lists)).
:- use_module(cod_limits, [with_time_spent/2]).

/** <module> Stack grants: a memory budget across the running queries

SWI-Prolog 9.0 bounds the stacks of one thread (its stack_limit flag) and
the process as a whole (RLIMIT_AS), but nothing across threads: 64 queries
that each build a 0.8 MB answer as a list of codes (stacks of 20 to 130 MB
each) took the engine past its 4 GiB address space, and it exited (issue
23, the flood of never-reading clients).  So every thread that runs work
for a client runs it first under a small stack limit (query_stack,
the limit the thread is created with), and the few that need more hold a
large grant while they run again:

  - with_stack_grant(Make, Use, Refused) calls Make, which makes a result
    under the small limit and says whether it outgrew it (a stack
    overflow: error(resource_error(stack), _) in 9.0);
  - if it did, Make's bindings are undone, the thread's stacks trimmed,
    and Make runs again under large_stack once the thread holds one
    of large_stacks grants; Use (sending the result) runs under the same
    grant, which is given back, and the stacks trimmed, after it;
  - at most large_stacks_per_uid grants are held by one unprivileged uid,
    and unprivileged uids together leave reserved_privileged_stacks to
    root and the daemon; a thread that may not take one waits in one FIFO
    for at most large_stack_wait_s seconds, and then call(Refused, Error)
    answers its client instead (error(resource_error(cod_stack_grant(..)), _));
    work under a time limit waits no longer than its limit leaves, and then
    gets cod_limit(time) (a 0.25 s query waited 5 s, and its caller had
    given up on the engine after 2.25 s: issue 47's sandbox walk).

Make must be re-runnable (a read, or a query in snapshot/1: what it
changed is dropped) and must not fail.  The bound this gives (with the
threads' own C stacks and what trim_thread_stacks/0 leaves them) is
worked out in docs/security.md, "Memory across the running queries".
*/

:- meta_predicate
    with_stack_grant(1, 0, 1).

:- dynamic
    grant_option/2,        % Name, Value
    waiting/3,             % Seq, Client, Thread: waits for a large grant
    holder/2.              % Thread, Client: holds one

%!  grant_default(?Name, ?Default) is nondet.
%
%   The grants' settings and their defaults: the options of grants_init/1,
%   and the SKB server's command-line settings of the same names.
grant_default(query_stack, 4194304).
grant_default(large_stack, 134217728).
grant_default(large_stacks, 4).
grant_default(reserved_privileged_stacks, 1).
grant_default(large_stacks_per_uid, 1).
grant_default(large_stack_wait_s, 5).

%!  grants_init(+Options) is det.
%
%   Options: the settings of grant_default/2.
grants_init(Options) :-
    must_be(list, Options),
    retractall(grant_option(_, _)),
    forall(grant_default(Name, Default),
           (   Opt =.. [Name, Value],
               option(Opt, Options, Default),
               must_be(positive_integer, Value),
               assertz(grant_option(Name, Value))
           )),
    forall(member(F, [cod_grants_held, cod_grants_unprivileged, cod_grants_refused, cod_grants_taken]),
           set_flag(F, 0)).

%   grant_value(+Name, -Value): a setting, its default before grants_init/1
%   (tools and tests that load the pool without the server).
grant_value(Name, Value) :-
    (   grant_option(Name, Value0) -> Value = Value0 ; grant_default(Name, Value) ).

%!  with_stack_grant(:Make, :Use, :Refused) is det.
%
%   call(Make, Outgrew) then call(Use), as described in the module
%   header.  Outgrew is true when Make ran out of stack.  Make run again
%   gets only the time its first run and the wait for the grant left of
%   the limits of its limited calls (with_time_spent/2).  When Make runs
%   again under a large grant, none of the bindings of Make and Use are
%   kept (they run in \+ \+, so that the stacks are empty again when the
%   grant goes back): Use must do all that is to be done with the result.
with_stack_grant(Make, Use, Refused) :-
    get_time(Start),
    nb_setval(cod_limit_seconds, 0),
    (   once(call(Make, Outgrew)),
        Outgrew == false
    ->  call(Use),
        trim_thread_stacks
    ;   trim_thread_stacks,
        client(Client),
        grant_wait(Start, Wait, Why),
        (   Wait =< 0
        ->  call(Refused, Why)
        ;   take_grant(Client, Wait)
        ->  grant_value(large_stack, Large),
            set_prolog_flag(stack_limit, Large),
            get_time(Now),
            Spent is Now - Start,      % the first run's and the wait's time
            catch(\+ \+ ( with_time_spent(Spent, call(Make, _)), call(Use) ), E, true),
            give_grant(Client),
            (   var(E) -> true ; throw(E) )
        ;   flag(cod_grants_refused, R, R+1),
            call(Refused, Why)
        )
    ).

%!  ensure_stack_room(+Bytes) is det.
%
%   The calling thread has Bytes of its stack limit free (after a garbage
%   collection if it must), or this throws
%   error(resource_error(stack), cod_stack_room(Bytes)), a stack overflow
%   raised here in Prolog, which with_stack_grant/3 answers as it answers
%   any: the request runs again under a large grant.  For the engine's own
%   work inside a request whose memory grows with the engine's code, not
%   the client's data: the sandbox check decompiles library clauses with
%   clause/3, which cannot collect garbage while it runs, and SWI-Prolog
%   9.0.4 leaves a stack overflow raised inside it pending ("foreign
%   predicate clause/3 did not clear exception"); the engine went on in
%   that state and died (issue 47's sandbox walk, in CI).
ensure_stack_room(Bytes) :-
    must_be(positive_integer, Bytes),
    current_prolog_flag(stack_limit, Limit),
    (   stacks_used(Used0), Limit - Used0 >= Bytes
    ->  true
    ;   garbage_collect,
        stacks_used(Used), Limit - Used >= Bytes
    ->  true
    ;   throw(error(resource_error(stack), cod_stack_room(Bytes)))
    ).

stacks_used(Used) :-
    statistics(globalused, G),
    statistics(localused, L),
    statistics(trailused, T),
    Used is G + L + T.

%   grant_wait(+Start, -Seconds, -Why): how long the calling thread may wait
%   for a large grant, and the error it gets if none comes: at most
%   large_stack_wait_s, and never past the time limit of the work (the
%   outermost limited call of its first run, cod_limits.pl), whose caller
%   stops waiting for it soon after.
grant_wait(Start, Seconds, Why) :-
    grant_value(large_stack_wait_s, Max),
    (   nb_current(cod_limit_seconds, Limit), number(Limit), Limit > 0,
        get_time(Now),
        Left is Limit - (Now - Start),
        Left < Max
    ->  Seconds = Left,
        Why = cod_limit(time)
    ;   Seconds = Max,
        grant_value(query_stack, Small),
        Why = error(resource_error(cod_stack_grant(Small, Max)), _)
    ).

%!  client_thread_options(-Options) is det.
%
%   The options of thread_create/3 for a thread that runs clients' work (a
%   pool worker, a direct connection): the small stack limit, and a C stack
%   of c_stack_bytes, not the 8 MB default (each thread's C stack counts
%   in the engine's address space, used or not; SWI-Prolog's own
%   algorithms on terms are not recursive in C: a term nested 2,000,000
%   deep was written, copied, hashed, compared and asserted with 256 KB).
client_thread_options([stack_limit(Small), c_stack(CStack)]) :-
    grant_value(query_stack, Small),
    c_stack_bytes(CStack).

c_stack_bytes(1048576).

%!  outgrew_stacks(+Error) is semidet.
%
%   Error says that the thread ran out of its stacks (9.0 reports
%   resource_error(stack) for the combined limit; the older names of
%   the single stacks are taken too).
outgrew_stacks(E) :-
    nonvar(E),
    E = error(resource_error(Stack), _),
    memberchk(Stack, [stack, global_stack, local_stack, trail_stack]).

%!  outgrown(+Error, -Outgrew) is det.
%
%   Outgrew is true if Error says that the thread ran out of its stacks
%   (outgrew_stacks/1), else false: the flag that with_stack_grant/3's
%   Make returns.
outgrown(E, Outgrew) :-
    (   outgrew_stacks(E) -> Outgrew = true ; Outgrew = false ).

%   client(-Client): whom the calling thread works for (the pool's job or the
%   direct connection sets the global variable cod_client).
client(Client) :-
    (   nb_current(cod_client, Client0), Client0 = client(_, _)
    ->  Client = Client0
    ;   Client = client(daemon, true)
    ).

%!  trim_thread_stacks is det.
%
%   Give back the calling thread's stacks beyond what it uses, when they
%   hold more than a quarter of the small limit: an idle thread then keeps
%   little (a thousand idle direct connections are a thousand threads).
trim_thread_stacks :-
    statistics(global, Global),        % (statistics(stack, _) is all threads' together)
    statistics(local, Local),
    statistics(trail, Trail),
    Allocated is Global + Local + Trail,
    grant_value(query_stack, Small),
    (   Allocated > Small // 4
    ->  trim_stacks
    ;   true
    ).

		 /*******************************
		 *        TAKING, GIVING        *
		 *******************************/

%   take_grant(+Client, +Seconds) is semidet: the calling thread holds a
%   large grant, now or after waiting in the FIFO; fails after Seconds.
take_grant(Client, Seconds) :-
    thread_self(Me),
    exit_hook,
    with_mutex(cod_grants,
               (   may_take(Client)
               ->  count(Client, 1),
                   assertz(holder(Me, Client)),
                   Wait = false
               ;   flag(cod_grants_seq, Seq, Seq+1),
                   assertz(waiting(Seq, Client, Me)),
                   Wait = true
               )),
    (   Wait == false
    ->  true
    ;   catch(thread_get_message(Me, cod_grant, [timeout(Seconds)]), E,
              ( stop_waiting(Client, Me, Granted),
                ( Granted == true -> give_grant(Client) ; true ),
                throw(E) ))
    ->  true
    ;   stop_waiting(Client, Me, true)    % given one as the wait ended
    ).

%   stop_waiting(+Client, +Me, -Granted): Me waits no longer; Granted is
%   true if it was given a grant meanwhile (its message is taken too).
stop_waiting(Client, Me, Granted) :-
    with_mutex(cod_grants,
               (   retract(waiting(_, Client, Me))
               ->  Granted = false
               ;   Granted = true
               )),
    (   Granted == true
    ->  ignore(thread_get_message(Me, cod_grant, [timeout(0)]))
    ;   true
    ).

may_take(Client) :-
    grant_value(large_stacks, Max),
    get_flag(cod_grants_held, Held),
    Held < Max,
    (   Client = client(Uid, false)
    ->  grant_value(reserved_privileged_stacks, Reserved),
        grant_value(large_stacks_per_uid, PerUid),
        get_flag(cod_grants_unprivileged, Unprivileged),
        Unprivileged < max(1, Max - min(Reserved, Max // 2)),
        uid_key(Uid, Key),
        get_flag(Key, Mine),
        Mine < PerUid
    ;   true
    ).

%   count(+Client, +Delta): under the cod_grants mutex.
count(Client, Delta) :-
    get_flag(cod_grants_held, H0), H is H0 + Delta, set_flag(cod_grants_held, H),
    (   Delta > 0 -> flag(cod_grants_taken, T, T+1) ; true ),
    (   Client = client(Uid, false)
    ->  get_flag(cod_grants_unprivileged, U0), U is U0 + Delta,
        set_flag(cod_grants_unprivileged, U),
        uid_key(Uid, Key),
        get_flag(Key, M0), M is M0 + Delta, set_flag(Key, M)
    ;   true
    ).

uid_key(Uid, Key) :-
    atom_concat('cod_grants uid ', Uid, Key).

%   give_grant(+Client): the calling thread's large grant goes back (its
%   stacks trimmed and its limit small again first), and the oldest waiters
%   that may take one now get theirs.
give_grant(Client) :-
    grant_value(query_stack, Small),
    trim_stacks,
    %   The large run's stacks are unwound, so this holds; were it refused, the
    %   thread would keep the large limit without a grant (counted as held).
    (   catch(set_prolog_flag(stack_limit, Small), _, fail)
    ->  Delta = -1
    ;   Delta = 0
    ),
    thread_self(Me),
    with_mutex(cod_grants,
               (   count(Client, Delta),
                   (   Delta < 0 -> retractall(holder(Me, _)) ; true ),
                   findall(T, next_waiter(T), Ts)
               )),
    wake(Ts).

next_waiter(Thread) :-
    waiting(Seq, Client, Thread),
    may_take(Client),
    retract(waiting(Seq, Client, Thread)),
    count(Client, 1),
    assertz(holder(Thread, Client)).

wake(Threads) :-
    forall(member(T, Threads), catch(thread_send_message(T, cod_grant), _, true)).

%   exit_hook: once per thread, before it may hold a grant.  A thread that
%   ends while it holds one or waits for one (killed, or exited: not an
%   exception, which with_stack_grant/3 sees) gives it back or waits no
%   longer (thread_gone/0), so no grant is lost with a thread.
exit_hook :-
    (   nb_current(cod_grants_exit_hook, true)
    ->  true
    ;   thread_at_exit(cod_grants:thread_gone),
        nb_setval(cod_grants_exit_hook, true)
    ).

:- public thread_gone/0.
thread_gone :-
    thread_self(Me),
    with_mutex(cod_grants,
               (   retractall(waiting(_, _, Me)),
                   (   retract(holder(Me, Client))
                   ->  count(Client, -1),
                       findall(T, next_waiter(T), Ts)
                   ;   Ts = []
                   )
               )),
    wake(Ts).

%!  grant_stats(-Pairs) is det.
%
%   large_grants_held, large_grants_waiting, and since the start
%   large_grants_taken and large_grants_refused.
grant_stats([large_grants_held-H, large_grants_waiting-W, large_grants_taken-T,
             large_grants_refused-R]) :-
    get_flag(cod_grants_held, H),
    get_flag(cod_grants_taken, T),
    get_flag(cod_grants_refused, R),
    aggregate_all(count, waiting(_, _, _), W).
