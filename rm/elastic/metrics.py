"""What the net reads: a pluggable metric, in percent of the CPUs the group held.

The paper runs the same net on CPU load and, in a second experiment, on the
HT/IMC ratio of uncore counters (Section V-B, thresholds 0.1 and 0.4).  A VM
without uncore PMU counters cannot measure HT/IMC; what the kernel offers
instead is delay accounting, so the second metric here is the group's CPU
*demand*: the time its threads ran plus the time they were runnable but
waiting, over the CPU time it was given.  Alone on its CPUs a group's demand
equals its load; when other processes share its CPUs (or its threads
outnumber them) the demand shows the shortfall that the load hides.

A metric is any object with ``name``, ``needs_delay`` and ``value(sample,
n_cpus)``; `METRICS` maps the names settings accept to the ones we ship.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .errors import ElasticError
from .measure import Sample


class Metric(Protocol):
    name: str
    needs_delay: bool

    def value(self, sample: Sample, n_cpus: int) -> float:
        """Percent of the ``n_cpus`` held during the sample's interval."""


def _capacity(sample: Sample, n_cpus: int) -> float:
    if n_cpus < 1:
        raise ElasticError(f"a group holds at least one CPU, not {n_cpus}")
    return sample.interval_s * n_cpus


@dataclass(frozen=True)
class CpuLoad:
    name: str = "cpu_load"
    needs_delay: bool = False

    def value(self, sample: Sample, n_cpus: int) -> float:
        capacity = _capacity(sample, n_cpus)
        return 0.0 if capacity <= 0 else 100.0 * sample.cpu_s / capacity


@dataclass(frozen=True)
class CpuDemand:
    name: str = "cpu_demand"
    needs_delay: bool = True

    def value(self, sample: Sample, n_cpus: int) -> float:
        capacity = _capacity(sample, n_cpus)
        if capacity <= 0:
            return 0.0
        if sample.delay_s is None:
            raise ElasticError("the cpu_demand metric needs the run-queue delay, which was not measured")
        return 100.0 * (sample.cpu_s + sample.delay_s) / capacity


METRICS: dict[str, Metric] = {m.name: m for m in (CpuLoad(), CpuDemand())}


def metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise ElasticError(f"unknown elastic metric {name!r}; choose one of {', '.join(METRICS)}") from None
