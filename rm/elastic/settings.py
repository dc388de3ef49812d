"""The settings of one elastic group, with their defaults and checks.

Defaults are the paper's: th_min = 10 % and th_max = 70 % of the group's
allocated cores (Dominico et al., ICDE 2018, Sections III-B and V), one core
to start with, adaptive-priority placement.  `ElasticSettings.from_mapping`
reads a TOML table or a JSON object and names the key that is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import ElasticError

MODES = ("adaptive", "dense", "sparse")
METRICS = ("cpu_load", "cpu_demand")


@dataclass(frozen=True)
class ElasticSettings:
    th_min: float = 10.0          # percent of the allocated cores: at or below, release one
    th_max: float = 70.0          # percent of the allocated cores: at or above, allocate one
    period_s: float = 0.5         # one measurement and one evaluation of the net per period
    mode: str = "adaptive"        # which core: adaptive | dense | sparse
    metric: str = "cpu_load"      # what the net reads: cpu_load | cpu_demand (taskstats delay)
    min_cores: int = 1            # never fewer (the paper's floor is one core)
    max_cores: int | None = None  # never more; None: every CPU the group may use
    pages_refresh_s: float = 2.0  # adaptive mode: how old the pages-per-node picture may be
    history: int = 16             # fired transitions kept for inspection (SKB facts)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        for name in ("th_min", "th_max", "period_s", "pages_refresh_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ElasticError(f"elastic setting {name} must be a number, not {value!r}")
        if not 0 <= self.th_min < self.th_max <= 100:
            raise ElasticError(
                f"elastic thresholds must satisfy 0 <= th_min < th_max <= 100 (percent), "
                f"got th_min={self.th_min} th_max={self.th_max}")
        if self.period_s <= 0:
            raise ElasticError(f"elastic setting period_s must be positive, not {self.period_s}")
        if self.pages_refresh_s < 0:
            raise ElasticError(f"elastic setting pages_refresh_s must be >= 0, not {self.pages_refresh_s}")
        if self.mode not in MODES:
            raise ElasticError(f"unknown elastic mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.metric not in METRICS:
            raise ElasticError(f"unknown elastic metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        for name in ("min_cores", "history"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ElasticError(f"elastic setting {name} must be a whole number >= 1, not {value!r}")
        if self.max_cores is not None:
            if isinstance(self.max_cores, bool) or not isinstance(self.max_cores, int) or self.max_cores < 1:
                raise ElasticError(f"elastic setting max_cores must be a whole number >= 1, not {self.max_cores!r}")
            if self.max_cores < self.min_cores:
                raise ElasticError(f"elastic max_cores ({self.max_cores}) is below min_cores ({self.min_cores})")

    @classmethod
    def from_mapping(cls, data: dict[str, Any], origin: str = "elastic settings") -> "ElasticSettings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ElasticError(f"{origin}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except TypeError as err:
            raise ElasticError(f"{origin}: {err}") from err

    def with_(self, **changes: Any) -> "ElasticSettings":
        return replace(self, **changes)
