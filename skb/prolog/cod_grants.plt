/*  plunit tests of the stack grants: work that outgrows a thread's small
    stacks is made again under a large grant, the grants are shared per uid
    with a reserve for privileged clients, and a waiter is refused in time.
*/
:- begin_tests(cod_grants).

:- use_module(cod_grants).

:- dynamic used/2.

test(stack_overflows_are_told_from_other_errors) :-
    assertion(outgrew_stacks(error(resource_error(stack), _))),
    assertion(outgrew_stacks(error(resource_error(global_stack), _))),
    assertion(\+ outgrew_stacks(error(resource_error(memory), _))),
    assertion(\+ outgrew_stacks(error(resource_error(c_stack), _))),
    assertion(\+ outgrew_stacks(cod_limit(time))),
    assertion(\+ outgrew_stacks(_)).

%   A list of 500,000 integers (12 MB) under a 4 MB limit: made again with
%   128 MB, used, and the grant given back with the thread's limit small again.
test(work_that_outgrows_the_small_stacks_is_made_again_under_a_grant,
     [ setup(fresh([])), cleanup(retractall(used(_, _))) ]) :-
    in_client_thread(client(1000, false),
                     ( with_stack_grant(long_list(500000, Len), assertz(used(len, Len)), refused),
                       current_prolog_flag(stack_limit, After),
                       assertz(used(limit_after, After)) )),
    assertion(used(len, 500000)),
    assertion(used(limit_after, 4194304)),
    grant_stats(Stats),
    assertion(memberchk(large_grants_held-0, Stats)),
    assertion(memberchk(large_grants_taken-1, Stats)).

test(work_within_the_small_stacks_takes_no_grant, [ setup(fresh([])), cleanup(retractall(used(_, _))) ]) :-
    in_client_thread(client(1000, false),
                     with_stack_grant(long_list(1000, Len), assertz(used(len, Len)), refused)),
    assertion(used(len, 1000)),
    grant_stats(Stats),
    assertion(memberchk(large_grants_taken-0, Stats)).

%   Two grants, one of them the privileged reserve: while uid 1000 holds the
%   other, uid 1001 waits one second and is refused; root takes the reserve.
test(grants_are_shared_per_uid_with_a_privileged_reserve,
     [ setup(fresh([large_stacks(2), reserved_privileged_stacks(1), large_stack_wait_s(1)])),
       cleanup(retractall(used(_, _))) ]) :-
    thread_self(Me),
    message_queue_create(Release),
    thread_create(in_client_thread(client(1000, false),
                                   with_stack_grant(long_list(500000, _),
                                                    ( thread_send_message(Me, holding),
                                                      thread_get_message(Release, release) ),
                                                    refused)),
                  Holder, []),
    thread_get_message(holding),
    get_time(T0),
    in_client_thread(client(1001, false),
                     with_stack_grant(long_list(500000, _), assertz(used(other, made)), refused_as(other))),
    get_time(T1),
    in_client_thread(client(0, true),
                     with_stack_grant(long_list(500000, L), assertz(used(root, L)), refused_as(root))),
    thread_send_message(Release, release),
    thread_join(Holder, HolderStatus),
    message_queue_destroy(Release),
    assertion(HolderStatus == true),
    assertion(used(other, refused(error(resource_error(cod_stack_grant(4194304, 1)), _)))),
    Waited is T1 - T0,
    assertion(Waited > 0.9),
    assertion(used(root, 500000)),
    grant_stats(Stats),
    assertion(memberchk(large_grants_held-0, Stats)),
    assertion(memberchk(large_grants_refused-1, Stats)).

%   A thread that ends while it holds a grant (thread_exit/1, not an
%   exception) gives it back: without the exit hook, the engine's grants
%   were lost one by one and every large query refused.
test(a_thread_that_exits_holding_a_grant_gives_it_back,
     [ setup(fresh([large_stacks(1), large_stack_wait_s(1)])), cleanup(retractall(used(_, _))) ]) :-
    client_thread_options(Options),
    thread_create(( nb_setval(cod_client, client(1000, false)),
                    with_stack_grant(long_list(500000, _), thread_exit(gone), refused) ),
                  Id, Options),
    thread_join(Id, Status),
    assertion(Status == exited(gone)),
    grant_stats(Stats),
    assertion(memberchk(large_grants_held-0, Stats)),
    in_client_thread(client(1001, false),
                     with_stack_grant(long_list(500000, L), assertz(used(after, L)), refused)),
    assertion(used(after, 500000)).

%   Work made again under a grant gets what its first run left of its time
%   limit: the first run sleeps 0.6 s of its 1 s and then outgrows its
%   stacks; the second is stopped 0.4 s into the same sleep (it had its whole
%   second again, and finished, before with_time_spent/2).
test(work_made_again_gets_only_the_time_its_first_run_left,
     [ setup(fresh([])), cleanup(retractall(used(_, _))) ]) :-
    in_client_thread(client(1000, false),
                     with_stack_grant(slow_then_long, true, refused)),
    assertion(used(made, cod_limit(time))),
    assertion(\+ used(made, done)).

slow_then_long(Outgrew) :-
    catch(( cod_limits:run_limited(( sleep(0.6), numlist(1, 500000, L), length(L, _) ), 1, 100000000),
            assertz(used(made, done)) ),
          E, true),
    (   var(E) -> Outgrew = false
    ;   outgrew_stacks(E) -> Outgrew = true
    ;   assertz(used(made, E)), Outgrew = false
    ).

%   long_list(+N, -Len, -Outgrew): make a list of N integers, and say
%   whether that ran out of stack (as the server's Make closures do).
long_list(N, Len, Outgrew) :-
    catch(( numlist(1, N, L), length(L, Len) ), E, true),
    (   var(E) -> Outgrew = false
    ;   outgrew_stacks(E) -> Outgrew = true
    ;   throw(E)
    ).

refused(E) :- throw(unexpected_refusal(E)).

refused_as(Who, E) :- assertz(used(Who, refused(E))).

%   in_client_thread(+Client, :Goal): run Goal in a thread made as the pool
%   makes its workers, working for Client; fail if Goal did not succeed.
in_client_thread(Client, Goal) :-
    client_thread_options(Options),
    thread_create(( nb_setval(cod_client, Client), Goal ), Id, Options),
    thread_join(Id, Status),
    assertion(Status == true).

fresh(Options) :-
    grants_init(Options).

:- end_tests(cod_grants).
