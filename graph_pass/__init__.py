"""graph_pass: rdmadev's planner, from TF's cross-task `_Send`/`_Recv` pairs to an exact region plan.

Pure Python on networkx; knows nothing of fabrics, never imports TensorFlow, and imports nothing
of rdmadev: what it must decide exactly as rdmadev's native side does (the slot layout, which ops
are pairs, the branch mark, the shape rules) its caller hands in as ``rules``, a ``NativeRules``
(rdmadev gives ``rdmadev._core.PLANNER_RULES``). The passes, each a plain function in its own
module::

    graph = load(partitions)                             # GraphDefs or their bytes -> networkx
    transfers = find_transfers(graph, rules)             # cross-task pairs and their facts
    plan = plan_regions(transfers, Config(), rules=rules)  # decisions + exact region layout
    validate(plan, graph, rules)                         # invariants, or ValidationError
    print(explain(plan, "plan.png"))                     # text table + picture

``plan_partitions(partitions, rules=rules)`` runs them all (the native pass's entry point);
``PassView.of(plan)`` is what the native pass applies (``graph_pass.pass_view``) and
``Plan.to_json()`` the plan as a document. Results are kept on the graph under
``data["rdmadev"]``.
"""

import logging

from . import layout
from .layout import Layout
from .native_rules import NativeRules
from .pass_view import PassView
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
    "layout", "Layout", "NativeRules", "PassView", "GraphPassError", "LoadError", "ConfigError", "PlanError", "PlanFormatError", "ValidationError",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
