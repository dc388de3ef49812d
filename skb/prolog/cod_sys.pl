/*  COD System Knowledge Base: system-level facts and the paper's predicates.

    This module is the only place where system-level facts live.  Every
    application module imports it, so application code can read these
    predicates but never change them: the facts are written only through
    cod_sys_assert/1 and cod_sys_retract/2, which the server exposes to the
    Resource Manager and administrators alone.

    The schema (names, argument meanings, units, keys) is documented in
    docs/skb-schema.md; keep the two in step.
*/

:- module(cod_sys,
          [ % hardware (loaded from cod.facts)
            machine_name/1,        % ?Name
            package/2,             % ?PackageId, ?Cpus
            numa_node/3,           % ?Node, ?MemBytes, ?Cpus
            numa_free/2,           % ?Node, ?FreeBytes
            numa_bandwidth/2,      % ?Node, ?BytesPerS
            memory_bandwidth/3,    % ?CpuNode, ?MemoryNode, ?BytesPerS
            node_distance/3,       % ?From, ?To, ?Distance
            core/4,                % ?CoreId, ?Package, ?Node, ?Pus
            pu/4,                  % ?Cpu, ?CoreId, ?Package, ?Node
            pu_offline/1,          % ?Cpu
            cache/4,               % ?Level, ?Type, ?SizeBytes, ?Cpus
            allowed_cpus/1,        % ?Cpus
            allowed_mems/1,        % ?Nodes
            total_memory/1,        % ?Bytes
            % run-time state (written by the Resource Manager)
            task/3,                % ?Task, ?Pid, ?App
            task_property/3,       % ?Task, ?Key, ?Value
            allocated/2,           % ?Task, ?Cpu
            allocation_epoch/1,    % ?Epoch
            other_task/3,          % ?Pid, ?Comm, ?Cpus
            cpu_load/2,            % ?Cpu, ?Percent
            task_cpu_use/2,        % ?Task, ?Percent
            task_numa_pages/3,     % ?Task, ?Node, ?Pages
            % cache partitioning (written by the Resource Manager where resctrl exists)
            cache_partition/3,     % ?Group, ?Domain, ?Mask
            cache_group_task/2,    % ?Group, ?Task
            cache_occupancy/3,     % ?Group, ?Domain, ?Bytes
            cache_mbm_total/3,     % ?Group, ?Domain, ?Bytes
            cache_policy/1,        % ?Text
            % elastic groups (written by the Resource Manager, docs/elastic.md)
            elastic_group/4,       % ?Group, ?Source, ?Mode, ?Metric
            elastic_thresholds/3,  % ?Group, ?ThMin, ?ThMax
            elastic_cores/2,       % ?Group, ?Cpus
            elastic_load/2,        % ?Group, ?Percent
            elastic_marking/3,     % ?Group, ?Place, ?Tokens
            elastic_state/2,       % ?Group, ?State
            elastic_transition/3,  % ?Group, ?T, ?Time
            % derived predicates, including those of the COD paper
            usable_cpu/1,          % ?Cpu
            get_nr_cores/1,        % -Count
            get_list_free_cpus/1,  % -Cpus
            get_list_numa_sizes/1, % -Sizes
            get_free_memory/1,     % -Bytes
            cpu_affinity/3,        % ?Cpu, ?Core, ?Node
            memory_affinity/3,     % ?Node, ?SizeBytes, ?FreeBytes
            smt_siblings/2,        % +Cpu, -Cpus
            l3_domain/2,           % ?Cpus, ?SizeBytes
            current_app/1,         % -App
            % trusted writers (not reachable from application code)
            cod_sys_predicate/2,   % ?Name, ?Arity
            cod_sys_hardware_predicate/2,
            cod_sys_assert/1,      % +Fact
            cod_sys_retract/2      % +Pattern, -Count
          ]).
:- use_module(library(error)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).

/** <module> System-level facts of the COD SKB

Facts about the hardware come from cod.facts (sysfs discovery, hwloc XML
import or a reference machine); facts about tasks and allocations come
from the Resource Manager.  Ids are always the operating system's own
numbers: a CPU is its Linux CPU number, a core is identified by the lowest
CPU number among its hardware threads, a NUMA node by its Linux node number.
*/

%!  cod_sys_hardware_predicate(?Name, ?Arity) is nondet.
%
%   Hardware predicates, replaced as a whole when a machine is loaded.
cod_sys_hardware_predicate(machine_name, 1).
cod_sys_hardware_predicate(package, 2).
cod_sys_hardware_predicate(numa_node, 3).
cod_sys_hardware_predicate(numa_free, 2).
cod_sys_hardware_predicate(numa_bandwidth, 2).
cod_sys_hardware_predicate(memory_bandwidth, 3).
cod_sys_hardware_predicate(node_distance, 3).
cod_sys_hardware_predicate(core, 4).
cod_sys_hardware_predicate(pu, 4).
cod_sys_hardware_predicate(pu_offline, 1).
cod_sys_hardware_predicate(cache, 4).
cod_sys_hardware_predicate(allowed_cpus, 1).
cod_sys_hardware_predicate(allowed_mems, 1).
cod_sys_hardware_predicate(total_memory, 1).

%!  cod_sys_predicate(?Name, ?Arity) is nondet.
%
%   Every predicate that holds system-level facts.
cod_sys_predicate(Name, Arity) :-
    cod_sys_hardware_predicate(Name, Arity).
cod_sys_predicate(task, 3).
cod_sys_predicate(task_property, 3).
cod_sys_predicate(allocated, 2).
cod_sys_predicate(allocation_epoch, 1).
cod_sys_predicate(other_task, 3).
cod_sys_predicate(cpu_load, 2).
cod_sys_predicate(task_cpu_use, 2).
cod_sys_predicate(task_numa_pages, 3).
cod_sys_predicate(cache_partition, 3).
cod_sys_predicate(cache_group_task, 2).
cod_sys_predicate(cache_occupancy, 3).
cod_sys_predicate(cache_mbm_total, 3).
cod_sys_predicate(cache_policy, 1).
cod_sys_predicate(elastic_group, 4).
cod_sys_predicate(elastic_thresholds, 3).
cod_sys_predicate(elastic_cores, 2).
cod_sys_predicate(elastic_load, 2).
cod_sys_predicate(elastic_marking, 3).
cod_sys_predicate(elastic_state, 2).
cod_sys_predicate(elastic_transition, 3).

:- dynamic
    machine_name/1, package/2, numa_node/3, numa_free/2, numa_bandwidth/2, memory_bandwidth/3, node_distance/3,
    core/4, pu/4, pu_offline/1, cache/4, allowed_cpus/1, allowed_mems/1,
    total_memory/1,
    task/3, task_property/3, allocated/2, allocation_epoch/1, other_task/3,
    cpu_load/2, task_cpu_use/2, task_numa_pages/3,
    cache_partition/3, cache_group_task/2, cache_occupancy/3, cache_mbm_total/3, cache_policy/1,
    elastic_group/4, elastic_thresholds/3, elastic_cores/2, elastic_load/2, elastic_marking/3,
    elastic_state/2, elastic_transition/3.

%!  cod_sys_assert(+Fact) is det.
%
%   Add one system-level fact.
%   @error domain_error(cod_system_fact, Fact) if Fact is not in the schema.
cod_sys_assert(Fact) :-
    must_be(callable, Fact),
    sys_fact_head(Fact),
    assertz(Fact).

%!  cod_sys_retract(+Pattern, -Count) is det.
%
%   Remove every system-level fact unifying with Pattern.
cod_sys_retract(Pattern, Count) :-
    must_be(callable, Pattern),
    sys_fact_head(Pattern),
    aggregate_all(count, retract(Pattern), Count).

sys_fact_head(Fact) :-
    functor(Fact, Name, Arity),
    (   cod_sys_predicate(Name, Arity)
    ->  true
    ;   domain_error(cod_system_fact, Name/Arity)
    ).

%!  current_app(-App) is semidet.
%
%   The application on whose behalf the current query runs (set by the
%   server for the duration of each query).
current_app(App) :-
    nb_current(cod_app, App),
    App \== [].

%!  usable_cpu(?Cpu) is nondet.
%
%   Cpu is online and allowed to this SKB's machine partition (cpuset).
usable_cpu(Cpu) :-
    pu(Cpu, _, _, _),
    (   allowed_cpus(Allowed)
    ->  memberchk(Cpu, Allowed)
    ;   true
    ).

%!  get_nr_cores(-Count) is det.
%
%   Number of usable CPUs (hardware threads): the unit COD allocates.
get_nr_cores(Count) :-
    aggregate_all(count, usable_cpu(_), Count).

%!  get_list_free_cpus(-Cpus) is det.
%
%   Usable CPUs, ascending, that are neither allocated to a task of
%   another application nor busy with other (unregistered) work.  CPUs
%   allocated to the calling application's own tasks count as free for it.
get_list_free_cpus(Cpus) :-
    (   current_app(App) -> true ; App = '$none' ),
    findall(Cpu,
            ( usable_cpu(Cpu),
              \+ ( allocated(Task, Cpu), \+ task(Task, _, App) ),
              \+ ( other_task(_, _, Busy), memberchk(Cpu, Busy) )
            ),
            Cpus0),
    sort(Cpus0, Cpus).

%!  get_list_numa_sizes(-Sizes) is det.
%
%   Memory size in bytes of every NUMA node whose size is known, in node
%   id order.
get_list_numa_sizes(Sizes) :-
    findall(Node-Size, (numa_node(Node, Size, _), integer(Size)), Pairs0),
    keysort(Pairs0, Pairs),
    pairs_values(Pairs, Sizes).

%!  get_free_memory(-Bytes) is det.
%
%   Free memory over all nodes.  Nodes whose free memory is not known
%   count with their size; with no node sizes at all, total_memory/1.
get_free_memory(Bytes) :-
    findall(Free, ( memory_affinity(_, _, Free), integer(Free) ), Frees),
    (   Frees == []
    ->  ( total_memory(Bytes) -> true ; Bytes = 0 )
    ;   sum_list(Frees, Bytes)
    ).

%!  cpu_affinity(?Cpu, ?Core, ?Node) is nondet.
%
%   Cpu (a Linux CPU number) belongs to core Core and NUMA node Node.
cpu_affinity(Cpu, Core, Node) :-
    pu(Cpu, Core, _, Node).

%!  memory_affinity(?Node, ?SizeBytes, ?FreeBytes) is nondet.
%
%   NUMA node Node has SizeBytes of memory of which FreeBytes are free
%   (FreeBytes = SizeBytes when free memory is not measured).
memory_affinity(Node, Size, Free) :-
    numa_node(Node, Size, _),
    (   numa_free(Node, Free0)
    ->  Free = Free0
    ;   Free = Size
    ).

%!  smt_siblings(+Cpu, -Cpus) is semidet.
%
%   Cpus are all hardware threads of Cpu's core, Cpu included.
smt_siblings(Cpu, Cpus) :-
    pu(Cpu, Core, _, _),
    core(Core, _, _, Cpus).

%!  l3_domain(?Cpus, ?SizeBytes) is nondet.
%
%   Cpus share one last-level (L3) cache of SizeBytes.
l3_domain(Cpus, Size) :-
    cache(3, Type, Size, Cpus),
    Type \== instruction.
