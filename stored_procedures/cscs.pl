/*  CSCS's stored procedures: initial deployment (the COD paper's Listing 3)
    and tuple redistribution (Section 7.4).
*/

:- module(cscs,
          [ dbos_cost_function/3,    % -Status, -NrCores, -PartSize
            cscs_redistribute/5      % +Current, +Cores, -Status, -Parts, -Moves
          ]).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(pairs)).
:- use_module(library(error)).
:- use_module(library(aggregate)).
:- use_module(library(assoc)).
:- use_module(library(ordsets)).
:- use_module(cod_skb(cod_sys)).

/** <module> CSCS stored procedures (COD paper, Listing 3 and Section 7.4)

A library procedure: preloaded by the SKB and callable by every
application.  It is module-transparent: context_module/1 names the
namespace of the application that calls it, and the application's facts
(db_ntuple/1 and the others) are read there.  System predicates come from
cod_sys, which every application sees too.

The calling application pushes, as in the paper's Listing 1:

  - db_ntuple(N): tuples in the dataset;
  - db_tsize(B): bytes per tuple;
  - db_nquery(Q), db_nupdate(U): queries and updates per batch;
  - db_rtime(Ms): the response-time SLA in milliseconds;
  - db_cost_fn(NTuples, NRequests, RTimeMs, Cores): its cost function,
    the number of cores (a real number) that meets the SLA.  For CSCS
    (Section 4.4): RT = c * tuples / cores * (a * requests + b), so
    Cores is c * NTuples * (a * NRequests + b) / RTimeMs.
*/

:- module_transparent dbos_cost_function/3.

%!  dbos_cost_function(-Status, -NrCores, -PartSize) is semidet.
%
%   Derive the deployment of the calling application's scan threads.
%
%   NrCores is the larger of (1) the cores the cost function asks for to
%   meet the SLA, rounded up, and (2) the cores needed so that every
%   partition fits in the smallest NUMA node, rounded up.  PartSize is the
%   dataset size in bytes divided by NrCores (integer division).  Status
%   is 0 when the deployment fits, 1 when there are not enough free cores,
%   2 when the dataset does not fit in free memory.
dbos_cost_function(Status, NrCores, PartSize) :-
    context_module(App),
    App:db_tsize(TSize), App:db_ntuple(NTuple),
    App:db_nquery(NQuery), App:db_nupdate(NUpdate),
    App:db_rtime(RTime),

    get_free_memory(AvailMemory),
    get_list_free_cpus(AvailCores),
    get_list_numa_sizes(NumaSizes),

    Memory is NTuple * TSize,

    NRequests is NQuery + NUpdate,
    App:db_cost_fn(NTuple, NRequests, RTime, SlaCores),
    SlaNrCores is max(1, ceiling(SlaCores)),

    min_list(NumaSizes, MinNumaSize),
    NumaNrCores is max(1, ceiling(Memory / MinNumaSize)),
    NrCores is max(NumaNrCores, SlaNrCores),

    PartSize is Memory // NrCores,

    length(AvailCores, NrAvail),
    (   NrCores > NrAvail -> Status = 1
    ;   Memory > AvailMemory -> Status = 2
    ;   Status = 0
    ).


		 /*******************************
		 *     TUPLE REDISTRIBUTION     *
		 *******************************/

:- module_transparent cscs_redistribute/5.

%!  cscs_redistribute(+Current, +Cores, -Status, -Parts, -Moves) is det.
%
%   Where the calling application's tuples go when its set of cores
%   changes (COD paper, Section 7.4): CSCS calls this on an allocation
%   upcall, before its next scan phase, and applies the answer.
%
%   Current is the partitions it has, a list of Cpu-Tuples; Cores is the
%   list of CPUs it will have (the upcall's).  Parts is the new partitions,
%   Cpu-Tuples for every CPU of Cores in that order, and Moves the tuples
%   to move, a list of move(From, To, Tuples): From gives Tuples of its
%   partition to To's (which ones is the engine's choice).  A partition
%   only gives or only takes.
%
%   1. Balance.  The slowest scan thread bounds a batch's response time,
%      so every core gets an equal share, as far as memory allows.
%   2. Memory.  Tuples moved onto a core need free memory on its NUMA
%      node (memory_affinity/3; a node's free memory is shared equally by
%      our cores there, and unknown free memory is not checked).  A core
%      whose node is short takes what fits and the rest is spread evenly
%      over the others (water filling).  The odd tuples of an uneven split
%      go to the cores that hold most already (they move least).
%   3. Locality.  The tuples a core gives go first to the cores closest
%      to it: sharing its L1/L2 (SMT siblings), then its L3, then its NUMA
%      node, then by node distance (cache/4, cpu_affinity/3,
%      node_distance/3), so moved data stays in shared caches and on the
%      node where it can.
%
%   Status is 0, or 2 when the tuples do not fit in the free memory of the
%   new cores' nodes (then Parts and Moves are []).  The tuple size is the
%   application's db_tsize/1.
%
%   @error type_error, domain_error for malformed Current or Cores (empty,
%          negative counts, a CPU listed twice).
%   @error existence_error(cpu, Cpu) for a CPU of Cores the SKB does not
%          know.
%   @error existence_error(procedure, db_tsize/1) if the application has
%          not pushed its tuple size.
cscs_redistribute(Current, Cores, Status, Parts, Moves) :-
    context_module(App),
    app_tuple_size(App, TSize),
    redistribute(Current, Cores, TSize, Status, Parts, Moves).

% Not transparent from here on: meta-calls (maplist/3 and friends) in a
% transparent body would resolve their goals in the application's module.
app_tuple_size(App, TSize) :-
    (   catch(App:db_tsize(TSize), error(existence_error(procedure, _), _), fail)
    ->  must_be(positive_integer, TSize)
    ;   existence_error(procedure, db_tsize/1)
    ).

redistribute(Current, Cores, TSize, Status, Parts, Moves) :-
    check_partitions(Current),
    core_nodes(Cores, Nodes),
    pairs_values(Current, Counts),
    sum_list(Counts, Total),
    list_to_assoc(Current, Held),
    node_shares(Nodes, TSize, Shares),
    maplist(core_cap(Held, Shares), Cores, Nodes, Caps),
    (   targets(Cores, Caps, Held, Total, Parts0)
    ->  Status = 0,
        Parts = Parts0,
        redistribution_moves(Current, Parts, Moves)
    ;   Status = 2,
        Parts = [],
        Moves = []
    ).

check_partitions(Current) :-
    must_be(list, Current),
    maplist(check_partition, Current),
    pairs_keys(Current, Cpus),
    distinct_cpus(Cpus).

check_partition(Part) :-
    (   Part = Cpu-Tuples
    ->  must_be(nonneg, Cpu),
        must_be(nonneg, Tuples)
    ;   type_error(pair, Part)
    ).

%   core_nodes(+Cores, -Nodes): checks Cores; Nodes are their NUMA nodes.
core_nodes(Cores, Nodes) :-
    must_be(list, Cores),
    (   Cores == []
    ->  domain_error(non_empty_list, Cores)
    ;   true
    ),
    maplist(core_node, Cores, Nodes),
    distinct_cpus(Cores).

core_node(Cpu, Node) :-
    must_be(nonneg, Cpu),
    (   cpu_affinity(Cpu, _, Node0)
    ->  Node = Node0
    ;   existence_error(cpu, Cpu)
    ).

distinct_cpus(Cpus) :-
    sort(Cpus, Set),
    length(Set, N),
    (   length(Cpus, N)
    ->  true
    ;   domain_error(distinct_cpus, Cpus)
    ).

%   current_tuples(+Held, +Cpu, -Tuples): Held is Current as an assoc.
current_tuples(Held, Cpu, Tuples) :-
    (   get_assoc(Cpu, Held, T)
    ->  Tuples = T
    ;   Tuples = 0
    ).

%   node_shares(+Nodes, +TSize, -Shares)
%
%   Node-Share for each node of our new cores: the tuples each of our
%   cores there may take, its share of the node's free memory (inf when
%   that is not known).
node_shares(Nodes, TSize, Shares) :-
    msort(Nodes, Sorted),
    clumped(Sorted, Counts),
    maplist(node_share(TSize), Counts, Shares).

node_share(TSize, Node-Count, Node-Share) :-
    (   memory_affinity(Node, _, Free), integer(Free)
    ->  Share is (Free // TSize) // Count
    ;   Share = inf
    ).

%   core_cap(+Held, +Shares, +Cpu, +Node, -Cap)
%
%   The most tuples Cpu's partition can hold: what it holds now plus its
%   share of its node's free memory.
core_cap(Held, Shares, Cpu, Node, Cap) :-
    memberchk(Node-Share, Shares),
    (   Share == inf
    ->  Cap = inf
    ;   current_tuples(Held, Cpu, Have),
        Cap is Have + Share
    ).

%   targets(+Cores, +Caps, +Held, +Total, -Parts) is semidet.
%
%   Water filling: fails if the caps cannot hold Total.
targets(Cores, Caps, Held, Total, Parts) :-
    length(Cores, N),
    Level is (Total + N - 1) // N,
    \+ ( member(Cap, Caps), Cap \== inf, Cap < Level ),
    !,                                   % no cap binds: an even split
    even_split(Cores, Held, Total, Parts).
targets(Cores, Caps, Held, Total, Parts) :-
    pairs_keys_values(CoreCaps, Cores, Caps),
    sort(2, @=<, CoreCaps, ByCap),       % inf sorts after every integer
    fill(ByCap, Held, Total, Filled),
    list_to_assoc(Filled, FilledA),
    maplist(filled_part(FilledA), Cores, Parts).

filled_part(Filled, Cpu, Cpu-T) :-
    get_assoc(Cpu, Filled, T).

fill([], _, 0, []).
fill([Cpu-Cap|Rest], Held, Remaining, Filled) :-
    length([Cpu-Cap|Rest], N),
    Share is Remaining // N,
    (   Cap \== inf, Cap =< Share
    ->  Filled = [Cpu-Cap|Filled1],
        Remaining1 is Remaining - Cap,
        fill(Rest, Held, Remaining1, Filled1)
    ;   % Every core left can take Share, and one more each for the odd
        % tuples (their caps are all above Share).
        pairs_keys([Cpu-Cap|Rest], Left),
        even_split(Left, Held, Remaining, Filled)
    ).

%   even_split(+Cores, +Held, +Total, -Parts)
%
%   Total // N tuples per core, and one more for the Total mod N odd
%   ones, which go to the cores that hold most already (they move least),
%   then to the lower CPU numbers.
even_split(Cores, Held, Total, Parts) :-
    length(Cores, N),
    Share is Total // N,
    Extra is Total mod N,
    (   Extra =:= 0
    ->  Odd = []
    ;   findall(Neg-C, ( member(C, Cores), current_tuples(Held, C, H), Neg is -H ), Keyed),
        keysort(Keyed, ByHolding0),
        pairs_values(ByHolding0, ByHolding),
        length(Odd0, Extra),
        append(Odd0, _, ByHolding),
        list_to_ord_set(Odd0, Odd)
    ),
    share_parts(Cores, Odd, Share, Parts).

share_parts([], _, _, []).
share_parts([C|Cs], Odd, Share, [C-T|Ps]) :-
    (   ord_memberchk(C, Odd) -> T is Share + 1 ; T = Share ),
    share_parts(Cs, Odd, Share, Ps).

%   redistribution_moves(+Current, +Parts, -Moves)
%
%   Givers in order (lost cores first, then by CPU), each giving to the
%   takers closest to it first.
redistribution_moves(Current, Parts, Moves) :-
    msort(Current, Cur),
    msort(Parts, New),
    layout_diff(Cur, New, Lost, Shrinking, Takers),
    append(Lost, Shrinking, Givers),
    give_all(Givers, Takers, Moves).

%   layout_diff(+Cur, +New, -Lost, -Shrinking, -Takers)
%
%   Merge of the two layouts sorted by CPU: Lost and Shrinking are
%   Cpu-Give for the CPUs that go and those that stay with fewer tuples,
%   Takers Cpu-Need for the CPUs that end with more.
layout_diff([], New, [], [], Takers) :-
    include(gains, New, Takers).
layout_diff([C-H|Cur], [], Lost, [], []) :-
    include(gains, [C-H|Cur], Lost).
layout_diff([C-H|Cur], [P-W|New], Lost, Shrinking, Takers) :-
    compare(Order, C, P),
    layout_diff_(Order, C-H, P-W, Cur, New, Lost, Shrinking, Takers).

layout_diff_(<, C-H, PW, Cur, New, Lost, Shrinking, Takers) :-
    (   H > 0 -> Lost = [C-H|Lost1] ; Lost = Lost1 ),
    layout_diff(Cur, [PW|New], Lost1, Shrinking, Takers).
layout_diff_(>, CH, P-W, Cur, New, Lost, Shrinking, Takers) :-
    (   W > 0 -> Takers = [P-W|Takers1] ; Takers = Takers1 ),
    layout_diff([CH|Cur], New, Lost, Shrinking, Takers1).
layout_diff_(=, C-H, _-W, Cur, New, Lost, Shrinking, Takers) :-
    (   H > W
    ->  G is H - W, Shrinking = [C-G|Shrinking1], Takers = Takers1
    ;   W > H
    ->  N is W - H, Takers = [C-N|Takers1], Shrinking = Shrinking1
    ;   Shrinking = Shrinking1, Takers = Takers1
    ),
    layout_diff(Cur, New, Lost, Shrinking1, Takers1).

gains(_-N) :- N > 0.

give_all([], _, []).
give_all([From-Give|Givers], Takers0, Moves) :-
    giver_place(From, Place),
    closeness_keys(Takers0, Place, Keyed),
    keysort(Keyed, Ranked0),
    pairs_values(Ranked0, Ranked),
    give(Ranked, From, Give, Moves, Moves1, Takers1),
    give_all(Givers, Takers1, Moves1).

%   give(+Takers, +From, +Give, -Moves, ?Tail, -TakersLeft)
give([], _, _, Moves, Moves, []).
give([To-Need|Takers], From, Give, Moves, Tail, Left) :-
    (   Give =:= 0
    ->  Moves = Tail,
        Left = [To-Need|Takers]
    ;   N is min(Give, Need),
        Moves = [move(From, To, N)|Moves1],
        Give1 is Give - N,
        Need1 is Need - N,
        (   Need1 > 0
        ->  Left = [To-Need1|Left1]
        ;   Left = Left1
        ),
        give(Takers, From, Give1, Moves1, Tail, Left1)
    ).

%   giver_place(+From, -Place)
%
%   What closeness/3 needs of a giver, looked up once: place(Node,
%   Caches) with the (data or unified) caches From is in, as Level-Cpus;
%   Node is unknown for a CPU the SKB does not know (offline now).
giver_place(From, place(Node, Caches)) :-
    (   cpu_affinity(From, _, Node0) -> Node = Node0 ; Node = unknown ),
    findall(L-Cpus,
            ( cache(L, Type, _, Cpus), Type \== instruction, memberchk(From, Cpus) ),
            Caches0),
    msort(Caches0, Caches).

closeness_keys([], _, []).
closeness_keys([T|Ts], Place, [K-T|Ks]) :-
    closeness(Place, T, K),
    closeness_keys(Ts, Place, Ks).

%   closeness(+Place, +To-Need, -Key)
%
%   Key = k(CacheLevel, Distance, To): the lowest cache level the giver
%   and To share (4: none), the NUMA distance between their nodes (10:
%   same node), then the CPU number.  An unknown giver is far from all.
closeness(place(NF, Caches), To-_, k(Level, Distance, To)) :-
    (   member(L-Cpus, Caches), memberchk(To, Cpus)
    ->  Level = L                          % Caches are sorted by level
    ;   Level = 4
    ),
    (   NF == unknown
    ->  Distance = 255
    ;   cpu_affinity(To, _, NT),
        (   node_distance(NF, NT, D) -> Distance = D
        ;   NF == NT -> Distance = 10
        ;   Distance = 20
        )
    ).
