"""Query-plan deployment with resource activity vectors (Giceva et al., VLDB 2015).

A pure planning package beside the allocator: a dataflow graph of operator
threads with their RAVs (cpu_util, mem_bw) and a machine in, the fewest cores
and NUMA nodes that hold them out, with every operator's CPU.  No I/O in the
algorithm; the profiler and the bandwidth probe live in :mod:`.measure`.

For the RM::

    plan = deploy(parse_graph(graph_json), machine)   # plan.min_cores -> the task's min_cores
    placed = bind(plan, machine, allocated_cpus)       # phases 3-4 inside the task's CPUs
    placed.placement                                   # operator id (thread name) -> CPU
"""

from .collapse import Compound, collapse
from .errors import DeployError, GraphError, GraphTooLarge, InfeasibleError
from .graph import UTIL_SCALE, Graph, Operator, parse_graph
from .plan import COMM_LEN, Cluster, DeployPlan, Options, bind, comm_key, deploy
from .screen import Demand, GraphLimits, check_bytes, check_size, quick_demand

__all__ = [
    "COMM_LEN", "Cluster", "Compound", "Demand", "DeployError", "DeployPlan", "Graph", "GraphError",
    "GraphLimits", "GraphTooLarge", "InfeasibleError", "Operator", "Options", "UTIL_SCALE", "bind", "check_bytes",
    "check_size", "collapse", "comm_key", "deploy", "parse_graph", "quick_demand",
]
