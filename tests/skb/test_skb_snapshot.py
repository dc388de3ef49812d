"""Issue 47, item 1: a restarted engine is what it was, whatever compactions came before.

After a compaction the journal replays a snapshot of every application; until session 16 the
snapshot held only the first application that held anything (a cut in app_snapshot/2), so an
engine restart after a compaction lost every other application's facts and procedures.

Here against the real engine (AsyncSKB, the daemon's driver): many applications, compaction,
kill, restart, everything back; then a property test of random sequences of writes, disconnects,
compactions and restarts against a model, with snapshots whose replies come after later writes'
(``bulk_reply_chars`` small: every snapshot waits behind the small replies, as a large one does).
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cod.skb import AsyncSKB, EngineConfig, SKBError
from cod.skb.codec import PERSISTENT, Owner

# Facts as sent, and as the engine writes them back (write_canonical).
FACTS = {
    "p(1)": "p(1)", "p(-2)": "p(-2)", "q(a)": "q(a)", "q('B c')": "q('B c')", "r(1,2)": "r(1,2)",
    's("x y")': 's("x y")', "t(1.5)": "t(1.5)", "u([1,2])": "u([1,2])", "v(f(g))": "v(f(g))",
    "w('\\n')": "w('\\n')", "x(123456789012345678901234567890)": "x(123456789012345678901234567890)",
    "y(1r3)": "y(1r3)", "a(1.0Inf)": "a(1.0Inf)", "d({x})": "d({}(x))", "g(1-2)": "g(-(1,2))",
    "h('é')": "h(é)",
}
# Removal patterns, and which of the facts' names/first arguments they take.
PATTERNS = {"p(_)": ("p", None), "p(1)": ("p", "1"), "q(_)": ("q", None), "r(_,_)": ("r", None),
            "t(_)": ("t", None), "h(_)": ("h", None)}
# Procedures: one predicate each, on names no fact uses.
PROCEDURES = {"k/1": "k(X) :- p(X).", "m/1": "m(1). m(2).", "n/0": 'n :- s("x y").', "o/2": "o(X, Y) :- r(X, Y)."}
# The fact predicates a procedure calls: declared (dynamic, no facts) when it is added, if new.
CALLS = {"k/1": "p", "n/0": "s", "o/2": "r"}
APPS = ("alpha", "beta", "gamma", "Zürich db")
OWNERS: tuple[Owner, ...] = (PERSISTENT, 1, 2, 3)


@dataclass
class Model:
    """What every application holds: fact text -> owners, procedure -> persistent."""

    facts: dict[str, dict[str, set[Owner]]] = field(default_factory=dict)
    procs: dict[str, dict[str, bool]] = field(default_factory=dict)
    # Fact predicates an application has had since its namespace was made: a query of one that holds
    # no fact now fails, of any other raises an existence error.
    declared: dict[str, set[str]] = field(default_factory=dict)

    def add(self, app: str, owner: Owner, facts: list[str]) -> None:
        held = self.facts.setdefault(app, {})
        for f in facts:
            held.setdefault(FACTS[f], set()).add(owner)
            self.declared.setdefault(app, set()).add(f.split("(")[0])

    def remove(self, app: str, pattern: str) -> None:
        name, first = PATTERNS[pattern]
        held = self.facts.get(app, {})
        for text in [t for t in held if t.startswith(name + "(") and (first is None or t == f"{name}({first})")]:
            del held[text]

    def procedure(self, app: str, pi: str, persistent: bool) -> None:
        self.procs.setdefault(app, {})[pi] = persistent
        if pi in CALLS:
            self.declared.setdefault(app, set()).add(CALLS[pi])

    def drop_owner(self, app: str, owner: Owner) -> None:
        held = self.facts.get(app, {})
        for text in list(held):
            held[text].discard(owner)
            if not held[text]:
                del held[text]

    def release(self, app: str) -> None:
        held = self.facts.get(app, {})
        for text in [t for t, owners in held.items() if PERSISTENT not in owners]:
            del held[text]
        procs = self.procs.get(app, {})
        for pi in [pi for pi, p in procs.items() if not p]:
            del procs[pi]
        self._collect(app)

    def drop(self, app: str) -> None:
        self.facts.pop(app, None)
        self.procs.pop(app, None)
        self._collect(app)

    def _collect(self, app: str) -> None:
        """After a release or a drop, the engine frees the namespace of an application that holds nothing."""
        if not self.facts.get(app) and not self.procs.get(app):
            self.declared.pop(app, None)


async def observed(engine: AsyncSKB, app: str) -> tuple[list[str], dict[str, bool]]:
    facts = sorted(await engine.list_facts(app))
    described = await engine.describe_app(app)
    procs = {p["predicate"]: p["persistent"] for p in described["procedures"]}
    return facts, procs


# The facts' predicates (name, arity): r/2, and the others of arity 1.
FACT_PREDICATES = sorted({(f.split("(")[0], 2 if f.startswith("r(") else 1) for f in FACTS})


async def declared(engine: AsyncSKB, app: str) -> set[str]:
    """The fact predicates a query of app finds (with or without facts), not unknown ones."""
    found = set()
    for name, arity in FACT_PREDICATES:
        goal = f"{name}({', '.join('_' * arity)})"
        try:
            await engine.execute_query(app, goal)
            found.add(name)
        except SKBError as err:
            assert "unknown procedure" in err.message, err
    return found


async def check(engine: AsyncSKB, model: Model, when: str, *, predicates: bool = True) -> None:
    for app in APPS:
        facts, procs = await observed(engine, app)
        assert facts == sorted(model.facts.get(app, {})), f"{app}'s facts {when}"
        assert procs == model.procs.get(app, {}), f"{app}'s procedures {when}"
        if predicates:
            assert await declared(engine, app) == model.declared.get(app, set()), f"{app}'s fact predicates {when}"


async def kill_and_wait(engine: AsyncSKB) -> None:
    """SIGKILL the engine and wait until the restarted one answers (it replays the journal first)."""
    before = engine.restarts
    assert engine.pid is not None
    os.kill(engine.pid, signal.SIGKILL)
    for _ in range(600):
        if engine.restarts > before:
            break
        await asyncio.sleep(0.05)
    assert engine.restarts == before + 1, "the engine was not restarted"
    await engine.ping()  # waits for the replay: requests wait until the new engine is ready


def engine_config(compact_at: int) -> EngineConfig:
    # No stored procedures (faster starts); small snapshots count as bulk, so every snapshot's reply
    # waits behind the replies of the writes sent after it, as a large snapshot's does.
    return EngineConfig(load_library=False, journal_compact_at=compact_at, bulk_reply_chars=64)


def test_every_application_is_back_after_compaction_and_a_restart() -> None:
    """The issue's case: several applications, facts added one at a time (connected ones' and
    persistent ones), procedures, some applications' connections gone; compactions; a kill."""
    async def scenario() -> None:
        engine = await AsyncSKB.start(engine_config(compact_at=40))
        try:
            model = Model()
            for i in range(30):
                for n, app in enumerate(APPS):
                    owner = OWNERS[(i + n) % len(OWNERS)]
                    fact = f"f({i})"
                    await engine.add_facts(app, owner, [fact])
                    model.facts.setdefault(app, {}).setdefault(fact, set()).add(owner)
            for n, (pi, text) in enumerate(PROCEDURES.items()):
                for app in APPS:
                    await engine.add_procedure(app, text, persistent=n % 2 == 0)
                    model.procedure(app, pi, n % 2 == 0)
            for app in APPS[2:]:  # these applications' connections left: persistent state stays
                for owner in OWNERS[1:]:
                    await engine.drop_owner(app, owner)
                    model.drop_owner(app, owner)
                await engine.release_app(app)
                model.release(app)
            assert len(engine._session.journal) < 40, "the journal was compacted"
            await check(engine, model, "before the restart")
            await kill_and_wait(engine)
            await check(engine, model, "after the restart")
            # The owners came back too: a connection's departure takes exactly its facts.
            for app in APPS[:2]:
                await engine.drop_owner(app, 1)
                model.drop_owner(app, 1)
            await check(engine, model, "after connection 1 left")
        finally:
            await engine.close()

    asyncio.run(scenario())


# ---- the property test ----------------------------------------------------------------------------
apps = st.sampled_from(APPS)
owners = st.sampled_from(OWNERS)
steps = st.one_of(
    st.tuples(st.just("add"), apps, owners, st.lists(st.sampled_from(sorted(FACTS)), min_size=1, max_size=3)),
    st.tuples(st.just("remove"), apps, st.sampled_from(sorted(PATTERNS))),
    st.tuples(st.just("procedure"), apps, st.sampled_from(sorted(PROCEDURES)), st.booleans()),
    st.tuples(st.just("drop_owner"), apps, st.sampled_from(OWNERS[1:])),
    st.tuples(st.just("release"), apps),
    st.tuples(st.just("drop"), apps),
    st.tuples(st.just("restart")),
)
# A round's writes are sent together (the engine applies them in that order; their replies, and the
# snapshots that compactions ask for meanwhile, come in any order).
rounds = st.lists(st.lists(steps, min_size=1, max_size=6), min_size=1, max_size=6)


async def write(engine: AsyncSKB, model: Model, step: tuple[Any, ...]) -> None:
    kind, *args = step
    if kind == "add":
        app, owner, facts = args
        model.add(app, owner, facts)
        await engine.add_facts(app, owner, facts)
    elif kind == "remove":
        model.remove(args[0], args[1])
        await engine.remove_facts(args[0], [args[1]])
    elif kind == "procedure":
        app, pi, persistent = args
        model.procedure(app, pi, persistent)
        await engine.add_procedure(app, PROCEDURES[pi], persistent=persistent)
    elif kind == "drop_owner":
        model.drop_owner(args[0], args[1])
        await engine.drop_owner(args[0], args[1])
    elif kind == "release":
        model.release(args[0])
        await engine.release_app(args[0])
    else:
        model.drop(args[0])
        await engine.drop_app(args[0])


async def play(engine: AsyncSKB, model: Model, plan: list[list[tuple[Any, ...]]]) -> None:
    for round_ in plan:
        writes = [s for s in round_ if s[0] != "restart"]
        # The model changes in the order the writes are sent, which is the order the engine applies
        # them. Each is sent a moment after the one before, so that earlier ones' replies (and the
        # snapshots they ask for) come while later ones are on their way.
        sent = []
        for s in writes:
            sent.append(asyncio.ensure_future(write(engine, model, s)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*sent)
        await check(engine, model, f"after {writes}", predicates=False)
        if len(writes) < len(round_):
            await kill_and_wait(engine)
            await check(engine, model, f"after a restart following {writes}")
    await kill_and_wait(engine)
    await check(engine, model, "after the last restart")


@pytest.fixture(scope="module")
def engine_loop():
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(AsyncSKB.start(engine_config(compact_at=3)))
    yield loop, engine
    loop.run_until_complete(engine.close())
    loop.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=rounds)
def test_snapshot_and_replay_keep_what_a_model_keeps(engine_loop, plan) -> None:
    loop, engine = engine_loop

    async def scenario() -> None:
        for app in APPS:  # each example starts from nothing
            await engine.drop_app(app)
        await play(engine, Model(), plan)

    loop.run_until_complete(scenario())
