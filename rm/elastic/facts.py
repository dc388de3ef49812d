"""An elastic group as SKB facts: its net's marking, its last transitions, its CPUs.

The schema is in docs/skb-schema.md ("Elastic groups").  `group_facts`
returns, per pattern, the facts that replace every fact matching it, so a
writer can swap one group's facts as a whole (the RM's live-state writes work
this way).  Patterns name the group, so groups are replaced independently.
"""

from __future__ import annotations

from cod.facts.prolog import atom

from .controller import GroupState
from .petrinet import PLACES
from .settings import ElasticSettings


def _source(kind: str, value: object) -> str:
    if kind == "cgroup":
        return f"cgroup({atom(str(value))})"
    return "pids([" + ",".join(str(int(p)) for p in value) + "])"  # type: ignore[attr-defined]


def _num(x: float) -> str:
    return repr(round(float(x), 3))


def group_facts(name: str, source: tuple[str, object], settings: ElasticSettings,
                state: GroupState, load: float | None) -> dict[str, list[str]]:
    """{pattern: facts} for group ``name`` (facts without the final '.')."""
    g = atom(name)
    last = state.last
    return {
        f"elastic_group({g}, _, _, _)": [
            f"elastic_group({g}, {_source(*source)}, {settings.mode}, {settings.metric})"],
        f"elastic_thresholds({g}, _, _)": [
            f"elastic_thresholds({g}, {_num(settings.th_min)}, {_num(settings.th_max)})"],
        f"elastic_cores({g}, _)": [
            f"elastic_cores({g}, [{','.join(str(c) for c in sorted(state.cpus))}])"],
        f"elastic_load({g}, _)": [] if load is None else [f"elastic_load({g}, {_num(load)})"],
        f"elastic_marking({g}, _, _)": [
            f"elastic_marking({g}, {place.lower()}, {tokens})" for place, tokens in zip(PLACES, state.marking)],
        f"elastic_state({g}, _)": [] if last is None else [f"elastic_state({g}, {last.state.lower()})"],
        f"elastic_transition({g}, _, _)": [
            f"elastic_transition({g}, {f.transition}, {_num(f.at)})" for f in state.firings],
    }


def as_text(facts: dict[str, list[str]]) -> str:
    """Every fact, one per line, each ending in '.'."""
    return "".join(f"{fact}.\n" for group in facts.values() for fact in group)
