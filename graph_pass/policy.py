"""The swap policy: for each transfer, swap or keep, and why. The only place the policy lives.

Rules, first match wins:

1. ``client_terminated`` (a TF1 feed/fetch) -> keep.
2. an end on a client job (``/job:localhost``, ``/job:chief``) -> keep unless ``plan_client_pairs``.
3. a pair inside a branch of a lowered conditional (``in_cond``: its tensor may be dead; a half
   alone is told by the name rdmadev's pass gave its source, the rules' branch_mark) -> keep
   unless the ops carry dead tensors (``carries["dead_tensors"]``: TF's own _Send/_Recv
   labelled for rdmadev's kernels); a half inside a while loop's frame (``in_loop``: one
   transfer per iteration, the exit iteration's dead) -> keep unless they carry dead tensors
   and loops (``carries["loops"]``: the pass runs the loop's iterations in order); else on to
   the rules below.
4. DT_STRING / DT_VARIANT / DT_RESOURCE, reference or unknown dtypes -> keep.
5. only one half loaded -> keep when the ops cannot carry half pairs (``carries["half_pairs"]``)
   or no ``half_pair_capacity`` is set; else swap as a dynamic channel of that capacity (a
   known size above it fails the plan unless the ops carry dynamic shapes, which send a larger
   tensor staged or in chunks; a bound TF's shapes give below it is the capacity instead, and
   the sending half tells the receiver, which sizes the slots). Both halves see the same attrs
   and config, so they decide alike.
6. a control edge's empty dummy -> swap as a header-only signal.
7. a static shape -> swap with exact-size slots (keep if below ``min_bytes``).
8. a dynamic shape -> keep when the ops cannot carry dynamic shapes (``carries["dynamic_shapes"]``);
   else swap with a shape block when a capacity is known (``capacity_hints``; else the bound TF's
   shapes give, ``Transfer.bound_bytes``, when below ``default_dynamic_capacity``; else that
   default), else keep.

``Config.carries`` is what the runtime's ops can carry; it is the runtime's to say, and this
policy the only place it is applied, so nothing downstream decides again.
"""

from .devices import job_of
from .dtypes import DTYPES, UNSUPPORTED
from .errors import PlanError

__all__ = ["REASONS", "Decision", "decide"]

#: reason code -> (decision, explanation). Every plan's transfers carry one of these codes.
REASONS = {
    "static": ("swap", "static shape: K slots of exactly the tensor's bytes"),
    "control_signal": ("swap", "cross-task control edge (empty dummy tensor): a header-only signal slot"),
    "dynamic_bounded": ("swap", "dynamic shape with a known capacity (a hint, TF's bound or the default): "
                                "shape block + capacity"),
    "half_pair_capacity": ("swap", "only this half is planned here: dynamic channel of half_pair_capacity"),
    "client_terminated": ("keep", "feed or fetch of a TF1 client (client_terminated): TF's own path"),
    "client_task": ("keep", "to or from the client task: arguments and results stay on gRPC "
                            "(set plan_client_pairs to plan them)"),
    "in_loop": ("keep", "inside a while loop: a channel carries its tensors in order, and a loop's "
                        "iterations may run ahead of each other (TF's rendezvous keys each iteration); "
                        "the runtime's ops do not carry loops (config.carries['loops'] is False)"),
    "in_cond": ("keep", "inside a branch of a tf.cond / tf.case (lowered to Switch/Merge): on the branch not "
                        "taken the tensor is dead, and the runtime's ops do not carry a dead tensor "
                        "(config.carries['dead_tensors'] is False)"),
    "device_loop": ("keep", "inside a while loop, with an end on a device other than its task's CPU: "
                            "the copy through the CPU would need the loop's frame in the CPU's partition"),
    "non_plain_dtype": ("keep", "string/variant/resource, reference or unknown dtype: not flat bytes"),
    "dynamic_unbounded": ("keep", "dynamic shape without a bound (set capacity_hints or "
                                  "default_dynamic_capacity)"),
    "half_pair": ("keep", "only this half is in the planned graphs and the receiver cannot size it from "
                          "the attrs alone (set half_pair_capacity)"),
    "below_min_bytes": ("keep", "smaller than min_bytes: gRPC is as fast for tiny tensors"),
    "not_carried_dynamic": ("keep", "dynamic shape: the runtime's ops do not carry dynamic shapes "
                                    "(config.carries['dynamic_shapes'] is False)"),
    "not_carried_half_pair": ("keep", "only this half is in the planned graphs: the runtime's ops do not "
                                      "carry half pairs (config.carries['half_pairs'] is False)"),
}

_SIZES = {name: size for name, size in DTYPES.values()}


class Decision(tuple):
    """``(decision, reason, detail, capacity_bytes, rank_capacity)``; capacity is None for keeps."""

    __slots__ = ()

    def __new__(cls, reason, detail, capacity=None, rank_capacity=None):
        return super().__new__(cls, (REASONS[reason][0], reason, detail, capacity, rank_capacity))


def decide(t, config):
    """Decide one transfer.

    Args:
        t: a ``Transfer`` with facts from ``find_transfers``.
        config: the planner ``Config``.

    Returns:
        A ``Decision``.

    Raises:
        PlanError: a half pair whose known size exceeds ``half_pair_capacity`` when the ops
            carry no dynamic shapes (the other half cannot know the size, and only a dynamic
            channel sends a tensor larger than its slots, staged or in chunks).
    """
    if t.client_terminated:
        return Decision("client_terminated", f"{t.label}: client_terminated=true")
    client = [d for d in (t.send_device, t.recv_device) if job_of(d) in config.client_jobs]
    if client and not config.plan_client_pairs:
        return Decision("client_task", f"{t.label}: end on {client[0]}")
    if t.in_loop and not (config.carries["loops"] and config.carries["dead_tensors"]):
        return Decision("in_loop", f"{t.label}: in a while loop's frame")
    if t.in_cond and not config.carries["dead_tensors"]:
        return Decision("in_cond", f"{t.label}: in a conditional branch")
    if t.in_loop and t.via_host:
        device = t.send_device if t.send_host else t.recv_device
        return Decision("device_loop", f"{t.label}: in a while loop's frame, on {device}")
    if t.dtype in UNSUPPORTED or _SIZES.get(t.dtype) is None:
        return Decision("non_plain_dtype", f"{t.label}: dtype {t.dtype}")
    if t.halves != "both":
        if not config.carries["half_pairs"]:
            return Decision("not_carried_half_pair", f"{t.label}: only the {t.halves} half is in these graphs")
        cap = config.half_pair_capacity
        if cap is None:
            return Decision("half_pair", f"{t.label}: only the {t.halves} half is in these graphs")
        if t.bytes is not None and t.bytes > cap and not config.carries["dynamic_shapes"]:
            raise PlanError(f"{t.send_op or t.recv_op} node {t.label!r} ({t.tensor_name}) carries {t.bytes} bytes, "
                            f"more than half_pair_capacity={cap}; raise half_pair_capacity to at least "
                            f"{t.bytes} on every task (both halves must use the same value)")
        if t.bytes is None and t.bound_bytes is not None and t.bound_bytes < cap:
            return Decision("half_pair_capacity", f"{t.label}: capacity {t.bound_bytes} B (bound "
                            f"{list(t.bound)} from TF's shapes)", t.bound_bytes, len(t.bound))
        return Decision("half_pair_capacity", f"{t.label}: capacity {cap} B", cap, config.max_dynamic_rank)
    if t.kind == "control":
        return Decision("control_signal", f"{t.label}: signal only", 0, None)
    if t.bytes is not None:
        if t.bytes < config.min_bytes:
            return Decision("below_min_bytes", f"{t.label}: {t.bytes} B < min_bytes={config.min_bytes}")
        return Decision("static", f"{t.label}: {t.bytes} B ({t.shape_source})", t.bytes, None)
    if not config.carries["dynamic_shapes"]:
        return Decision("not_carried_dynamic", f"{t.label}: shape {t.shape} ({t.shape_source})")
    cap, source = _dynamic_capacity(t, config)
    rank = len(t.shape) if t.shape is not None else len(t.bound) if t.bound is not None else \
        config.max_dynamic_rank
    if cap is None:
        return Decision("dynamic_unbounded", f"{t.label}: shape {t.shape} (rank "
                                             f"{'unknown' if t.shape is None else rank}), no bound")
    return Decision("dynamic_bounded", f"{t.label}: shape {t.shape}, capacity {cap} B ({source})", cap, rank)


def _dynamic_capacity(t, config):
    """``(bytes, where they come from)`` a dynamic transfer's slots hold: its capacity hint;
    else the bound TF's shapes give when it is below ``default_dynamic_capacity`` (or there is no
    default); else that default. A bound never raises the default: it is what the tensor may
    reach, not what it usually carries, and a channel grows from the sizes it sees."""
    hint = config.capacity_hints.get(t.tensor_name, config.capacity_hints.get(t.src))
    if hint is not None:
        return hint, "capacity hint"
    default = config.default_dynamic_capacity
    if t.bound_bytes is not None and (default is None or t.bound_bytes < default):
        return t.bound_bytes, f"bound {list(t.bound)} from TF's shapes"
    return default, "default capacity"
