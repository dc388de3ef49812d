"""Phase 2: pack compound operators onto cores by cpu_util.

* :func:`first_fit_decreasing` is the paper's Algorithm 1: items by decreasing
  size, each into the first bin it fits in *and* that holds none of its
  siblings (line 5), else into a new bin.
* :func:`exact_min_bins` is the exact minimum with CP-SAT, so a plan can report
  how far FFD is from it (Dósa's tight bound: FFD <= 11/9 OPT + 6/9).
* :func:`balance` is the epilogue the paper names as future work: the same
  number of bins, the largest load made as small as possible (then the
  smallest as large as possible), moving as few items as it can.

Sizes and the capacity are integers (millionths of a core); an item carries
the set of sibling groups of its members.  Bins are lists of item indexes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

Bins = list[list[int]]

# Beyond this many item x bin booleans building an exact model alone takes seconds (and its
# memory grows with the product: a 1,400 x 1,400 epilogue took 2 GB): the exact search and the
# epilogue are skipped (FFD's answer stands, with the lower bound beside it).
EXACT_MAX_VARS = 20_000


def ffd_order(sizes: Sequence[int]) -> list[int]:
    """Item indexes by decreasing size; ties keep the input order (deterministic)."""
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))


def first_fit_decreasing(
    sizes: Sequence[int], capacity: int, groups: Sequence[frozenset[str]] | None = None
) -> Bins:
    """Algorithm 1.  An item larger than ``capacity`` gets a bin of its own."""
    groups = groups or [frozenset()] * len(sizes)
    bins: Bins = []
    loads: list[int] = []
    held: list[set[str]] = []
    for i in ffd_order(sizes):
        for b in range(len(bins)):
            if loads[b] + sizes[i] <= capacity and not (groups[i] & held[b]):
                bins[b].append(i)
                loads[b] += sizes[i]
                held[b] |= groups[i]
                break
        else:
            bins.append([i])
            loads.append(sizes[i])
            held.append(set(groups[i]))
    return bins


def lower_bound(sizes: Sequence[int], capacity: int, groups: Sequence[frozenset[str]] | None = None) -> int:
    """A bound no packing beats: total size over capacity, items over half the
    capacity (no two share a bin), and the largest sibling group."""
    if not sizes:
        return 0
    bound = max(1, math.ceil(sum(sizes) / capacity))
    bound = max(bound, sum(1 for s in sizes if 2 * s > capacity))
    counts: dict[str, int] = {}
    for g in groups or ():
        for name in g:
            counts[name] = counts.get(name, 0) + 1
    return max([bound, *counts.values()])


def is_valid_packing(bins: Bins, sizes: Sequence[int], capacity: int,
                     groups: Sequence[frozenset[str]] | None = None) -> bool:
    groups = groups or [frozenset()] * len(sizes)
    flat = sorted(i for b in bins for i in b)
    if flat != list(range(len(sizes))):
        return False
    for b in bins:
        if len(b) > 1 and sum(sizes[i] for i in b) > capacity:
            return False
        names = [n for i in b for n in groups[i]]
        if len(names) != len(set(names)):
            return False
    return True


@dataclass(frozen=True)
class Exact:
    count: int | None  # the proven minimum, or None when the search stopped first
    bins: Bins | None  # the best packing found (None if none within the time)
    bound: int  # best proven lower bound
    status: str  # "optimal" | "timeout" | "skipped"


def exact_min_bins(
    sizes: Sequence[int], capacity: int, groups: Sequence[frozenset[str]] | None,
    upper: Bins, *, time_limit_s: float = 2.0,
) -> Exact:
    """The minimum number of bins, by CP-SAT, starting from the packing ``upper``.

    Items larger than ``capacity`` (which no packing can fit) make the search
    pointless, and instances beyond EXACT_MAX_VARS too costly: status "skipped".
    """
    groups = list(groups or [frozenset()] * len(sizes))
    n = len(sizes)
    lb = lower_bound(sizes, capacity, groups)
    if n == 0:
        return Exact(0, [], 0, "optimal")
    if any(s > capacity for s in sizes):
        return Exact(None, None, lb, "skipped")
    if len(upper) <= lb:
        return Exact(len(upper), [list(b) for b in upper], lb, "optimal")
    if n * len(upper) > EXACT_MAX_VARS:
        return Exact(None, None, lb, "skipped")

    from ortools.sat.python import cp_model

    order = ffd_order(sizes)  # item k of the model is order[k]
    n_bins = len(upper)
    m = cp_model.CpModel()
    # Symmetry: the k-th largest item may only go into bins 0..k.
    x = {(k, b): m.new_bool_var(f"x{k}_{b}") for k in range(n) for b in range(min(k + 1, n_bins))}
    used = [m.new_bool_var(f"u{b}") for b in range(n_bins)]
    for k in range(n):
        m.add_exactly_one(x[k, b] for b in range(min(k + 1, n_bins)))
    for b in range(n_bins):
        in_b = [k for k in range(n) if (k, b) in x]
        m.add(sum(sizes[order[k]] * x[k, b] for k in in_b) <= capacity * used[b])
        by_group: dict[str, list[int]] = {}
        for k in in_b:
            for name in groups[order[k]]:
                by_group.setdefault(name, []).append(k)
        for members in by_group.values():
            if len(members) > 1:
                m.add_at_most_one(x[k, b] for k in members)
        if b + 1 < n_bins:
            m.add_implication(used[b + 1], used[b])
    m.add(sum(used) >= lb)
    m.minimize(sum(used))
    # Hint: FFD's packing renumbered so that bins appear in order of their largest item
    # (FFD opens bins in exactly that order, so the symmetry rule holds for it).
    rank = {i: k for k, i in enumerate(order)}
    bin_of = {i: b for b, items in enumerate(upper) for i in items}
    for k in range(n):
        for b in range(min(k + 1, n_bins)):
            m.add_hint(x[k, b], bin_of[order[k]] == b)
    for b in range(n_bins):
        m.add_hint(used[b], b < len(upper))

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Exact(None, None, lb, "timeout")
    bins: Bins = [[] for _ in range(n_bins)]
    for (k, b), var in x.items():
        if solver.value(var):
            bins[b].append(order[k])
    bins = [sorted(b, key=lambda i: rank[i]) for b in bins if b]
    bound = max(lb, int(math.ceil(solver.best_objective_bound - 1e-9)))
    if status == cp_model.OPTIMAL:
        return Exact(len(bins), bins, len(bins), "optimal")
    return Exact(None, bins, bound, "timeout")


@dataclass(frozen=True)
class Balanced:
    bins: Bins
    max_before: int
    max_after: int
    min_before: int
    min_after: int
    moved: int
    status: str  # "optimal" | "improved" | "unchanged" | "skipped"


def balance(
    sizes: Sequence[int], capacity: int, groups: Sequence[frozenset[str]] | None,
    bins: Bins, *, time_limit_s: float = 1.0,
) -> Balanced:
    """The load-balancing epilogue: keep ``len(bins)`` bins, minimise the largest
    load, then maximise the smallest.  ``moved`` counts the items that left the
    FFD bin they share most with (bins are unlabelled).  Skipped (the bins as
    given) beyond EXACT_MAX_VARS item x bin booleans."""
    groups = list(groups or [frozenset()] * len(sizes))
    loads = [sum(sizes[i] for i in b) for b in bins]
    if len(bins) < 2 or any(s > capacity for s in sizes) or len(sizes) * len(bins) > EXACT_MAX_VARS:
        return Balanced([list(b) for b in bins], max(loads, default=0), max(loads, default=0),
                        min(loads, default=0), min(loads, default=0), 0, "skipped")

    from ortools.sat.python import cp_model

    unchanged = Balanced([list(b) for b in bins], max(loads), max(loads), min(loads), min(loads), 0, "unchanged")
    # Stage 1: the smallest largest load.
    m, x, hi, lo = _balance_model(sizes, capacity, groups, bins)
    m.minimize(hi)
    s = _balance_solver(time_limit_s / 2)
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return unchanged
    best_hi = int(s.value(hi))
    proven = st == cp_model.OPTIMAL
    # Stage 2: with that bound, the largest smallest load.
    m, x, hi, lo = _balance_model(sizes, capacity, groups, bins)
    m.add(hi <= best_hi)
    m.maximize(lo)
    s = _balance_solver(time_limit_s / 2)
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return unchanged
    proven = proven and st == cp_model.OPTIMAL
    new: Bins = [[] for _ in range(len(bins))]
    for (i, b), var in x.items():
        if s.value(var):
            new[b].append(i)
    new_loads = [sum(sizes[i] for i in b) for b in new]
    if (max(new_loads), -min(new_loads)) >= (max(loads), -min(loads)):
        return unchanged
    # Keep the FFD order inside each bin and bins by decreasing load.
    rank = {i: k for k, i in enumerate(ffd_order(sizes))}
    new = sorted((sorted(b, key=lambda i: rank[i]) for b in new),
                 key=lambda b: (-sum(sizes[i] for i in b), rank[b[0]] if b else len(sizes)))
    return Balanced(new, max(loads), max(new_loads), min(loads), min(new_loads),
                    _moved(bins, new), "optimal" if proven else "improved")


def _balance_model(sizes: Sequence[int], capacity: int, groups: Sequence[frozenset[str]],
                   bins: Bins) -> tuple[Any, dict[tuple[int, int], Any], Any, Any]:
    """The balancing model: x[i,b] item i in bin b, siblings apart, loads in decreasing order,
    hinted with ``bins``.  Returns (model, x, largest load, smallest load)."""
    from ortools.sat.python import cp_model

    n, n_bins = len(sizes), len(bins)
    home = {i: b for b, items in enumerate(bins) for i in items}
    loads = [sum(sizes[i] for i in b) for b in bins]
    m = cp_model.CpModel()
    x = {(i, b): m.new_bool_var(f"x{i}_{b}") for i in range(n) for b in range(n_bins)}
    load = [m.new_int_var(0, capacity, f"l{b}") for b in range(n_bins)]
    for i in range(n):
        m.add_exactly_one(x[i, b] for b in range(n_bins))
    by_group: dict[str, list[int]] = {}
    for i in range(n):
        for name in groups[i]:
            by_group.setdefault(name, []).append(i)
    siblings = [members for members in by_group.values() if len(members) > 1]
    for b in range(n_bins):
        m.add(load[b] == sum(sizes[i] * x[i, b] for i in range(n)))
        for members in siblings:
            m.add_at_most_one(x[i, b] for i in members)
    # Bounds that let the solver prove optimality: the average load lies between them.
    total = sum(sizes)
    hi = m.new_int_var(max(-(-total // n_bins), max(sizes)), capacity, "max")
    lo = m.new_int_var(0, total // n_bins, "min")
    m.add_max_equality(hi, load)
    m.add_min_equality(lo, load)
    # The bins are interchangeable: look only at packings with loads in decreasing order.
    for b in range(n_bins - 1):
        m.add(load[b] >= load[b + 1])
    order = sorted(range(n_bins), key=lambda b: -loads[b])
    for i in range(n):
        for rank, b in enumerate(order):
            m.add_hint(x[i, rank], home[i] == b)
    return m, x, hi, lo


def _balance_solver(seconds: float) -> Any:
    from ortools.sat.python import cp_model

    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.random_seed = 0
    s.parameters.max_time_in_seconds = max(0.01, seconds)
    return s


def _moved(old: Bins, new: Bins) -> int:
    """Items not in the bin that best matches their old bin (bins are unlabelled)."""
    # Match each new bin to the old bin it shares most items with, greedily; only pairs that share
    # an item are counted (as many as there are items, not old x new bins).
    old_bin = {i: oi for oi, o in enumerate(old) for i in o}
    shared: dict[tuple[int, int], int] = {}
    for ni, nw in enumerate(new):
        for i in nw:
            key = (old_bin[i], ni)
            shared[key] = shared.get(key, 0) + 1
    pairs = sorted(((c, oi, ni) for (oi, ni), c in shared.items()), reverse=True)
    used_o: set[int] = set()
    used_n: set[int] = set()
    kept = 0
    for common, oi, ni in pairs:
        if oi in used_o or ni in used_n:
            continue
        used_o.add(oi)
        used_n.add(ni)
        kept += common
    return sum(len(b) for b in old) - kept
