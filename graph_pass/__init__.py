"""graph_pass: rdmadev's planner, from TF's cross-task `_Send`/`_Recv` pairs to an exact region plan.

Pure Python on networkx; knows nothing of fabrics and never imports TensorFlow. The passes, each
a plain function in its own module::

    graph = load(partitions)                       # GraphDefs or their bytes -> networkx
    transfers = find_transfers(graph)              # cross-task pairs and their facts
    plan = plan_regions(transfers, Config())       # decisions + exact region layout
    validate(plan, graph)                          # invariants, or ValidationError
    print(explain(plan, "plan.png"))               # text table + picture

``plan_partitions(partitions)`` runs them all (the native pass's entry point); ``Plan.to_json()``
is the contract the native pass applies. Results are kept on the graph under ``data["rdmadev"]``.
"""

import logging

from . import layout
from .errors import (ConfigError, GraphPassError, LoadError, PlanError, PlanFormatError,
                     ValidationError)
from .explain import explain
from .find_transfers import find_transfers
from .load import NS, load, may_have_transfers, partition_sets
from .pipeline import plan_partitions
from .plan import (PLAN_SCHEMA, PLAN_VERSION, Config, Plan, Region, TaskBlock, Transfer, channel_id,
                   channel_key)
from .plan_regions import new_instance_id, plan_regions
from .policy import REASONS
from .validate import validate

__all__ = [
    "load", "find_transfers", "plan_regions", "validate", "explain", "plan_partitions",
    "partition_sets", "may_have_transfers", "new_instance_id", "channel_id", "channel_key",
    "Config", "Plan", "Transfer", "Region", "TaskBlock", "PLAN_SCHEMA", "PLAN_VERSION", "REASONS", "NS",
    "layout", "GraphPassError", "LoadError", "ConfigError", "PlanError", "PlanFormatError", "ValidationError",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
