"""What the planner must decide exactly as rdmadev's native passes and kernels do, handed in by
its caller: the planner keeps no copy of any of it.

Each rule is decided once, in C++ (``_native/tf/pass/rules.h`` for the graph rules, the slot
layout in ``_native/core/channel.h``), and rdmadev's bindings hand the same ones to the planner
(``rdmadev._core.PLANNER_RULES``), as torch.fx passes policy into a pass. graph_pass imports
nothing of rdmadev; a caller without rdmadev's native library (a test of the planner alone)
passes rules of its own.

Example (rdmadev's bridge; ``PLANNER_RULES`` is rdmadev._core's)::

    plan = graph_pass.plan_partitions(partitions, rules=PLANNER_RULES)
"""

from collections.abc import Callable
from dataclasses import dataclass

from .layout import Layout

__all__ = ["NativeRules"]


@dataclass(frozen=True)
class NativeRules:
    """The native side's rules the planner applies.

    Attributes:
        layout: the slot and region layout the native protocol writes (a ``Layout``).
        send_ops: op names of a rendezvous pair's sending half (``_Send``, ``_HostSend``).
        recv_ops: op names of its receiving half.
        crosses_tasks: ``crosses_tasks(send_device, recv_device)``: whether a pair joins two
            tasks (the traffic rdmadev plans), as the pass tells which functions to plan.
        branch_mark: what the pass names the node it puts between a conditional branch's value
            and the task it crosses to; a half whose ``_src`` contains it is in a branch.
        bound_attr: the attr the pass writes on a pair's halves with a bound on a run-time shape.
        trusted_output: ``trusted_output(op, index)``: False where TF's shape function for that
            output is known to be wrong (oneDNN's fused ops), whose declared shape then counts
            as unknown.
        kernel_device: ``kernel_device(device)``: the device rdmadev's node for a half on
            `device` runs on: `device` if it is a CPU, else its task's CPU, through which the
            half then crosses (TF's own copy between the two).
    """

    layout: Layout
    send_ops: frozenset
    recv_ops: frozenset
    crosses_tasks: Callable
    branch_mark: str
    bound_attr: str
    trusted_output: Callable
    kernel_device: Callable

    def is_pair_op(self, op):
        """Whether `op` is either half of a rendezvous pair."""
        return op in self.send_ops or op in self.recv_ops
