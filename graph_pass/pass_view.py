"""The view of a plan the native pass applies: the one contract between the planner and the pass.

rdmadev's bridge returns a ``PassView`` of the plan it made, and the POST_PARTITIONING pass
(``_native/tf/pass/planner_call.cc``) reads it attribute by attribute, by the names below: nothing
crosses by position. A view holds one ``SwappedHalf`` per half of a swapped transfer with a
channel of its own and one ``BundleHalf`` per side of a bundle (``graph_pass.bundles``); each
refers to its ``Transfer`` and reads it, in three parts:

- ``facts`` (``HalfFacts``): what TF's graph says of the half: its node, its partition, the
  tensor's dtype and shape;
- ``decision`` (``HalfDecision``): what the planner decided for it: the channel, zero-copy, and
  how the pass applies it (a half pair's node owns its half; a tensor that may be dead keeps
  TF's node, labelled; a loop's frame runs one iteration at a time);
- ``limits`` (``Limits``): the bounds every node of the view gets: the plan's deadline and
  zero-copy threshold, and the runtime's largest tensor on a dynamic channel.

Adding a field the pass needs is one edit here (the part's field and where ``of`` reads it)
plus its uses in planner_call.cc and pass.cc. A field the pass finds missing, or of another
type, fails the instantiation with an error that names it.

Example:
    >>> view = PassView.of(plan, max_bytes=0)  # doctest: +SKIP
    >>> [(h.side, h.facts.node, h.decision.channel) for h in view.halves]  # doctest: +SKIP
"""

from dataclasses import dataclass

from .plan import Config, Transfer

__all__ = ["HalfFacts", "HalfDecision", "Limits", "SwappedHalf", "BundleMember", "BundleHalf",
           "PassView", "SIDES"]

#: The two sides of a transfer, in the order the pass replaces them: the `_Send`, the `_Recv`.
SIDES = ("send", "recv")


def _side(side):
    if side not in SIDES:
        raise ValueError(f"side {side!r}: must be one of {SIDES}")
    return side


@dataclass(frozen=True)
class HalfFacts:
    """What TF's graph says of one half of a transfer.

    Attributes:
        node: the `_Send` (side "send") or `_Recv` node's name.
        device: the partition it is in (the key of the pass's partition graphs).
        dtype: the tensor's DataType name, e.g. ``"DT_FLOAT"``.
        shape: its dims (-1: known only at run time), or None when the rank is too (a dynamic
            channel's slots then carry the whole shape).
    """

    node: str
    device: str
    dtype: str
    shape: tuple

    @classmethod
    def of(cls, t, side):
        """The facts of `side` of Transfer `t`."""
        return cls(node=getattr(t, f"{_side(side)}_node"), device=getattr(t, f"{side}_device"),
                   dtype=t.dtype, shape=None if t.shape is None else tuple(t.shape))


@dataclass(frozen=True)
class HalfDecision:
    """What the planner decided for one half of a swapped transfer.

    Attributes:
        channel: the channel key (``Transfer.channel_key``).
        zero_copy: the receive may alias its slot (``graph_pass.zero_copy``); False on a sender.
        owned: a half pair's node (one half planned here, TF1): its kernel holds the half while
            it lives.
        dead: its tensor may be dead (a conditional's branch, a loop's exit): the pass keeps
            TF's own node and labels it for rdmadev's kernels.
        loop: it runs in a while loop's frame: the pass runs that frame one iteration at a time.
        host: "" when rdmadev's node replaces the half's own, on its device; else the task's
            CPU, where rdmadev's node runs while the half's node stays on its device, its
            tensor crossing to (from) the CPU by TF's own copy (a GPU, PluggableDevice or XLA
            device has no rdmadev kernel).
    """

    channel: str
    zero_copy: bool
    owned: bool
    dead: bool
    loop: bool
    host: str

    @classmethod
    def of(cls, t, side):
        """The decision for `side` of the swapped Transfer `t`."""
        return cls(channel=t.channel_key, zero_copy=_side(side) == "recv" and bool(t.zero_copy),
                   owned=t.halves != "both", dead=bool(t.in_cond or t.in_loop), loop=bool(t.in_loop),
                   host=getattr(t, f"{side}_host") or "")


@dataclass(frozen=True)
class Limits:
    """The bounds the pass writes on every node of a view.

    Attributes:
        timeout_s: seconds any wait of the channel may take (``Config.deadline_s``).
        zero_copy_min_bytes: the smallest tensor a zero-copy receive aliases
            (``Config.zero_copy_min_bytes``).
        max_bytes: the largest tensor a dynamic channel carries (0: no limit): the runtime's
            (rdmadev's RDMADEV_MAX_TENSOR_BYTES), not the plan's.
    """

    timeout_s: float
    zero_copy_min_bytes: int
    max_bytes: int

    @classmethod
    def of(cls, config, max_bytes=0):
        """The limits of a plan of `config` in a runtime that refuses tensors above `max_bytes`."""
        return cls(timeout_s=float(config.deadline_s), zero_copy_min_bytes=int(config.zero_copy_min_bytes),
                   max_bytes=int(max_bytes or 0))


@dataclass(frozen=True)
class SwappedHalf:
    """One half of a swapped transfer with a channel of its own: the pass replaces its node by
    an RdmadevSend or RdmadevRecv (or labels it, ``decision.dead``)."""

    side: str
    transfer: Transfer
    limits: Limits

    def __post_init__(self):
        _side(self.side)

    @property
    def facts(self):
        """``HalfFacts`` of this half."""
        return HalfFacts.of(self.transfer, self.side)

    @property
    def decision(self):
        """``HalfDecision`` for this half."""
        return HalfDecision.of(self.transfer, self.side)


@dataclass(frozen=True)
class BundleMember:
    """One tensor of a bundle's side: its half's facts (static shape) and where its bytes start
    in the slot's payload."""

    facts: HalfFacts
    offset: int


@dataclass(frozen=True)
class BundleHalf:
    """One side of a bundle: the pass replaces the `_Send` (or `_Recv`) nodes of all of its
    members by one RdmadevSendBundle (RdmadevRecvBundle). `transfers` are the members in the
    order of their bytes in the slot (an empty tensor, a control edge's, before one that starts
    where it does)."""

    side: str
    transfers: tuple
    limits: Limits

    def __post_init__(self):
        _side(self.side)
        if not self.transfers:
            raise ValueError("a bundle has at least one member")

    @property
    def device(self):
        """The partition the side's nodes are in (every member's)."""
        return getattr(self.transfers[0], f"{self.side}_device")

    @property
    def host(self):
        """The task's CPU every member crosses through, or "" (``HalfDecision.host``)."""
        return getattr(self.transfers[0], f"{self.side}_host") or ""

    @property
    def channel(self):
        """The bundle's channel key (every member's)."""
        return self.transfers[0].channel_key

    @property
    def members(self):
        """A ``BundleMember`` per member, in slot order."""
        return tuple(BundleMember(HalfFacts.of(t, self.side), int(t.bundle_offset)) for t in self.transfers)


@dataclass(frozen=True)
class PassView:
    """What the native pass applies of a plan: its swapped halves, then its bundles' sides.

    Attributes:
        halves: ``SwappedHalf`` records, by transfer in plan order, a sender before its receiver.
        bundles: ``BundleHalf`` records, two per bundle (send, recv), bundles in plan order.
        config: the plan's ``Config``.
    """

    halves: tuple = ()
    bundles: tuple = ()
    config: Config = None

    @classmethod
    def of(cls, plan, max_bytes=0):
        """The view of `plan` (its swapped transfers) for a runtime whose dynamic channels refuse
        tensors above `max_bytes` (0: no limit).

        Args:
            plan: a validated ``Plan``.
            max_bytes: the runtime's largest tensor on a dynamic channel.

        Returns:
            A ``PassView``.
        """
        limits = Limits.of(plan.config, max_bytes)
        halves, bundles = [], {}
        for t in plan.swapped():
            if t.bundle:
                bundles.setdefault(t.channel_key, []).append(t)
                continue
            halves.extend(SwappedHalf(side, t, limits) for side in SIDES if t.halves in ("both", side))
        sides = []
        for members in bundles.values():
            members = tuple(sorted(members, key=lambda t: (t.bundle_offset, t.bytes)))
            sides.extend(BundleHalf(side, members, limits) for side in SIDES)
        return cls(halves=tuple(halves), bundles=tuple(sides), config=plan.config)
