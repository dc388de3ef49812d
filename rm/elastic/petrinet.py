"""The Petri net of Dominico et al. (ICDE 2018, Section III) as code: pure, no I/O.

Places ``P = (Checks, Idle, Stable, Overload, Provision)``; transitions
``T = (t0, ..., t7)``.  The net is a Predicate/Transition net: arc weights are
inscriptions over the binding ``(u, n)`` of one evaluation, where ``u`` is the
measured load in whole percent (the tokens of *Checks*) and ``n`` the cores
the group holds (the tokens of *Provision*)::

    t0  Checks(u) + Provision(n) -> Idle(n)                    if u <= th_min
    t1  Checks(u) + Provision(n) -> Overload(n)                if u >= th_max
    t2  Checks(u)                -> Stable(u)                  if th_min < u < th_max
    t3  Stable(u)                -> Checks(u)
    t4  Idle(n)                  -> Checks(u) + Provision(n-1) if n > n_min  (release one core)
    t5  Overload(n)              -> Checks(u) + Provision(n+1) if n < n_cap  (allocate one core)
    t6  Overload(n)              -> Checks(u) + Provision(n)   if n >= n_cap (nothing left to give)
    t7  Idle(n)                  -> Checks(u) + Provision(n)   if n <= n_min (keep the last core)

`pre_matrix`, `post_matrix` and `incidence` give the 5 x 8 matrices (rows are
places, columns transitions, A = Post - Pre) for a binding; the paper prints
the transpose A^T of the sub-nets (Figures 9-11).  One difference on purpose:
the paper's Figure 9 writes ``n_a`` on the arc t5 -> Provision while its text
says t5 allocates one more core; here the arc carries ``n + 1`` (and t4's
``n - 1``) so that the marking of *Provision* always is the core count.

One evaluation (`evaluate`) is one period: the sensor puts the new load in
*Checks* (the paper: "Checks is synchronously updated with the current
resource usage"), then exactly two transitions fire, one of t0/t1/t2 and one
of t3..t7, and the tokens are back in *Checks* and *Provision*.  *Checks*
holds at least one token (a load under 1 % counts as 1 %) so that a marked
place is never empty and the enabling rule stays the plain ``M >= Pre``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ElasticError

PLACES = ("Checks", "Idle", "Stable", "Overload", "Provision")
CHECKS, IDLE, STABLE, OVERLOAD, PROVISION = range(len(PLACES))
TRANSITIONS = ("t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7")
ALLOCATE, RELEASE = "t5", "t4"

# Arc inscriptions over the binding (u, n).
U, N, N_PLUS_1, N_MINUS_1 = "u", "n", "n+1", "n-1"

# (place, transition index) -> inscription; absent means no arc.
PRE: dict[tuple[int, int], str] = {
    (CHECKS, 0): U, (PROVISION, 0): N,
    (CHECKS, 1): U, (PROVISION, 1): N,
    (CHECKS, 2): U,
    (STABLE, 3): U,
    (IDLE, 4): N,
    (OVERLOAD, 5): N,
    (OVERLOAD, 6): N,
    (IDLE, 7): N,
}
POST: dict[tuple[int, int], str] = {
    (IDLE, 0): N,
    (OVERLOAD, 1): N,
    (STABLE, 2): U,
    (CHECKS, 3): U,
    (CHECKS, 4): U, (PROVISION, 4): N_MINUS_1,
    (CHECKS, 5): U, (PROVISION, 5): N_PLUS_1,
    (CHECKS, 6): U, (PROVISION, 6): N,
    (CHECKS, 7): U, (PROVISION, 7): N,
}

Marking = tuple[int, int, int, int, int]  # tokens per place, in PLACES order


@dataclass(frozen=True)
class Thresholds:
    th_min: float = 10.0
    th_max: float = 70.0

    def __post_init__(self) -> None:
        if not self.th_min < self.th_max:
            raise ElasticError(f"th_min ({self.th_min}) must be below th_max ({self.th_max})")


@dataclass(frozen=True)
class Bounds:
    """How far the net may move: at least ``n_min`` cores, at most ``n_cap``."""

    n_min: int = 1
    n_cap: int = 1  # min(the group's maximum, the external cap, the CPUs it may use)


@dataclass(frozen=True)
class Evaluation:
    """What one period did: the marking before and after, the transitions fired."""

    before: Marking
    after: Marking
    fired: tuple[str, str]  # one of t0/t1/t2, then one of t3..t7
    state: str  # the performance state passed through: Idle, Stable or Overload
    load: int  # u, the tokens put in Checks by the sensor

    @property
    def delta(self) -> int:
        """+1: allocate one core; -1: release one; 0: keep."""
        return self.after[PROVISION] - self.before[PROVISION]


def load_tokens(u: float) -> int:
    """The measured load (percent, any real) as the tokens of *Checks*: 1..100."""
    if u != u:  # NaN: no measurement is an error of the caller, never a decision
        raise ElasticError("load is NaN")
    return max(1, min(100, int(round(u))))


def initial_marking(n: int, u: float = 0.0) -> Marking:
    """m0: the first load in *Checks*, ``n`` cores in *Provision*, the rest empty."""
    if n < 1:
        raise ElasticError(f"a group holds at least one core, not {n}")
    return (load_tokens(u), 0, 0, 0, n)


def _weight(inscription: str, u: int, n: int) -> int:
    if inscription == U:
        return u
    if inscription == N:
        return n
    if inscription == N_PLUS_1:
        return n + 1
    return n - 1


def _matrix(arcs: dict[tuple[int, int], str], u: int, n: int) -> list[list[int]]:
    m = [[0] * len(TRANSITIONS) for _ in PLACES]
    for (p, t), inscription in arcs.items():
        m[p][t] = _weight(inscription, u, n)
    return m


def pre_matrix(u: int, n: int) -> list[list[int]]:
    """Pre(p, t) for the binding (u, n): 5 rows (places) x 8 columns (transitions)."""
    return _matrix(PRE, u, n)


def post_matrix(u: int, n: int) -> list[list[int]]:
    """Post(p, t) for the binding (u, n)."""
    return _matrix(POST, u, n)


def incidence(u: int, n: int) -> list[list[int]]:
    """A = Post - Pre (places x transitions); firing t changes M by column t."""
    pre, post = pre_matrix(u, n), post_matrix(u, n)
    return [[post[p][t] - pre[p][t] for t in range(len(TRANSITIONS))] for p in range(len(PLACES))]


def _guard(t: int, u: int, n: int, th: Thresholds, bounds: Bounds) -> bool:
    """The inscription R(t) of the paper: the condition for t to fire."""
    if t == 0:
        return u <= th.th_min
    if t == 1:
        return u >= th.th_max
    if t == 2:
        return th.th_min < u < th.th_max
    if t == 3:
        return True
    if t == 4:
        return n > bounds.n_min
    if t == 5:
        return n < bounds.n_cap
    if t == 6:
        return n >= bounds.n_cap
    return n <= bounds.n_min  # t7


# Pre-computed (transition, [(place, inscription)]) for the enabling test.
_INPUTS = [[(p, ins) for (p, tt), ins in PRE.items() if tt == t] for t in range(len(TRANSITIONS))]
_OUTPUTS = [[(p, ins) for (p, tt), ins in POST.items() if tt == t] for t in range(len(TRANSITIONS))]


def enabled(marking: Marking, u: int, n: int, th: Thresholds, bounds: Bounds) -> list[int]:
    """Transitions enabled in ``marking`` under the binding: tokens (M >= Pre) and guard."""
    return [t for t in range(len(TRANSITIONS))
            if all(marking[p] >= _weight(ins, u, n) for p, ins in _INPUTS[t])
            and _guard(t, u, n, th, bounds)]


def fire(marking: Marking, t: int, u: int, n: int) -> Marking:
    """M' = M + A[:, t] for the binding (u, n)."""
    m = list(marking)
    for p, ins in _INPUTS[t]:
        m[p] -= _weight(ins, u, n)
    for p, ins in _OUTPUTS[t]:
        m[p] += _weight(ins, u, n)
    if min(m) < 0:
        raise ElasticError(f"firing {TRANSITIONS[t]} from {marking} leaves negative tokens {tuple(m)}")
    return (m[0], m[1], m[2], m[3], m[4])


def at_rest(marking: Marking) -> bool:
    """Only *Checks* and *Provision* marked: one evaluation is complete."""
    return marking[IDLE] == marking[STABLE] == marking[OVERLOAD] == 0 and marking[CHECKS] > 0 \
        and marking[PROVISION] > 0


def evaluate(marking: Marking, u: float, th: Thresholds, bounds: Bounds) -> Evaluation:
    """One period: the sensor's load into *Checks*, then fire until the net is at rest again.

    ``marking`` must be at rest (as `initial_marking` and every evaluation leave
    it).  Exactly one transition is enabled at each step, by construction of the
    guards; anything else is a bug and raises.
    """
    if not at_rest(marking):
        raise ElasticError(f"the net is not at rest: {dict(zip(PLACES, marking))}")
    n = marking[PROVISION]
    if bounds.n_min < 1 or bounds.n_cap < 1:
        raise ElasticError(f"bounds must allow at least one core, got {bounds}")
    tokens = load_tokens(u)
    before: Marking = (tokens, 0, 0, 0, n)  # the sensor's synchronous update of Checks
    m = before
    fired: list[str] = []
    state = ""
    for _ in range(2):
        ready = enabled(m, tokens, n, th, bounds)
        if len(ready) != 1:
            raise ElasticError(f"net conflict at {m}: enabled {[TRANSITIONS[t] for t in ready]}")
        t = ready[0]
        m = fire(m, t, tokens, n)
        fired.append(TRANSITIONS[t])
        if not state:
            state = PLACES[IDLE if m[IDLE] else STABLE if m[STABLE] else OVERLOAD]
    if not at_rest(m):
        raise ElasticError(f"the net did not come to rest: {m} after {fired}")
    return Evaluation(before=before, after=m, fired=(fired[0], fired[1]), state=state, load=tokens)
