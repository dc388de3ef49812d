"""An elastic group as SKB facts: its net's marking, its last transitions, its CPUs.

The schema is in docs/skb-schema.md ("Elastic groups").  `group_facts`
returns, per pattern, the facts that replace every fact matching it, so a
writer can swap one group's facts as a whole (the RM's live-state writes work
this way).  Patterns name the group, so groups are replaced independently.
"""

from __future__ import annotations

from cod.protocol.prolog_text import ANY, Written, compound, number, term

from .controller import GroupState
from .petrinet import PLACES
from .settings import ElasticSettings


def _source(kind: str, value: object) -> Written:
    if kind == "cgroup":
        return compound("cgroup", str(value))
    return compound("pids", [int(p) for p in value], sep=",")  # type: ignore[attr-defined]


def _num(x: float) -> Written:
    return Written(number(round(float(x), 3)))


def group_facts(name: str, source: tuple[str, object], settings: ElasticSettings,
                state: GroupState, load: float | None) -> dict[str, list[str]]:
    """{pattern: facts} for group ``name`` (facts without the final '.')."""
    last = state.last
    return {
        compound("elastic_group", name, ANY, ANY, ANY): [
            compound("elastic_group", name, _source(*source), settings.mode, settings.metric)],
        compound("elastic_thresholds", name, ANY, ANY): [
            compound("elastic_thresholds", name, _num(settings.th_min), _num(settings.th_max))],
        compound("elastic_cores", name, ANY): [
            compound("elastic_cores", name, Written(term(sorted(state.cpus), sep=",")))],
        compound("elastic_load", name, ANY): [] if load is None else [compound("elastic_load", name, _num(load))],
        compound("elastic_marking", name, ANY, ANY): [
            compound("elastic_marking", name, place.lower(), tokens) for place, tokens in zip(PLACES, state.marking)],
        compound("elastic_state", name, ANY): [] if last is None else [
            compound("elastic_state", name, last.state.lower())],
        compound("elastic_transition", name, ANY, ANY): [
            compound("elastic_transition", name, f.transition, _num(f.at)) for f in state.firings],
    }


def as_text(facts: dict[str, list[str]]) -> str:
    """Every fact, one per line, each ending in '.'."""
    return "".join(f"{fact}.\n" for group in facts.values() for fact in group)
