"""Elastic cores for process groups that do not speak COD (Dominico et al., ICDE 2018).

* `petrinet`   -- the net: places, transitions t0-t7, Pre/Post/incidence, one evaluation;
* `modes`      -- which CPU: dense, sparse, adaptive priority over NUMA nodes;
* `controller` -- the policy of one group, a pure function of (state, measurement, limits);
* `group`      -- membership: a cgroup, or pids and their future children;
* `measure`, `taskstats`, `metrics` -- what the group used, and what the net reads;
* `facts`      -- the group as SKB facts;
* `runner`     -- the standalone loop (measure, decide, enforce) until the RM drives groups.
"""

from .controller import Decision, GroupState, Limits, Observation, start, step
from .errors import ElasticError, GroupGone
from .group import CgroupGroup, PidTreeGroup
from .modes import Layout
from .settings import ElasticSettings

__all__ = [
    "CgroupGroup", "Decision", "ElasticError", "ElasticSettings", "GroupGone", "GroupState", "Layout",
    "Limits", "Observation", "PidTreeGroup", "start", "step",
]
