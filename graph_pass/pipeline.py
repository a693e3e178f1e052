"""The whole planner in one call: load -> find_transfers -> plan_regions -> validate."""

import logging

from .find_transfers import find_transfers
from .load import load, may_have_transfers
from .plan import Config, Plan
from .plan_regions import plan_regions
from .validate import validate
from .zero_copy import mark_zero_copy

__all__ = ["plan_partitions"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


def plan_partitions(partitions, config=None, instance_id=None, return_graph=False, *, rules):
    """Plan one instantiation's partition graphs; the entry point the native pass calls.

    Partitions that cannot hold a `_Send`/`_Recv` (every eager op, single-task functions) return
    an empty plan without being parsed.

    Args:
        partitions: anything ``load`` accepts; the native pass hands ``{device: GraphDef bytes}``.
        config: a ``Config`` (default ``Config()``).
        instance_id: id for pairs whose both halves are planned (None: generated when needed).
        return_graph: also return the annotated networkx graph (None on the fast path).
        rules: the ``NativeRules`` the plan must agree with (rdmadev's bridge and ``rdmadev
            plan`` pass ``rdmadev._core.PLANNER_RULES``).

    Returns:
        A validated ``Plan``, or ``(plan, graph)`` when ``return_graph``.

    Raises:
        LoadError, PlanError, ValidationError: see the passes.

    Example:
        >>> plan = plan_partitions({dev: gd.SerializeToString() for dev, gd in parts.items()},
        ...                        rules=PLANNER_RULES)  # doctest: +SKIP
        >>> plan.to_json()  # doctest: +SKIP
    """
    config = config or Config()
    if not may_have_transfers(partitions, rules):
        plan = Plan(config=config, layout=rules.layout.to_dict())
        return (plan, None) if return_graph else plan
    graph = load(partitions)
    plan = plan_regions(find_transfers(graph, rules), config, instance_id, graph, rules=rules)
    plan = validate(mark_zero_copy(plan, graph), graph, rules)
    return (plan, graph) if return_graph else plan
