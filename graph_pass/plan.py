"""The plan: the versioned, JSON-serialisable contract between graph_pass and the native pass.

Schema ``rdmadev.plan`` version ``PLAN_VERSION`` (see ``Plan.to_dict`` for the exact keys)::

    {"schema": "rdmadev.plan", "version": 4,
     "layout": {...graph_pass.layout.Layout.to_dict(): the native one it was laid out with...},
     "config": {...Config fields...},
     "instance_id": "9f2c..." | null,
     "transfers": [Transfer, ...],     # every cross-task pair found, swapped or kept, with its reason
     "regions":   [Region, ...],       # one per (receiving task, sending task) with swapped pairs
     "tasks":     [TaskBlock, ...]}    # per receiving task: total bytes to register, its regions

Version 2 added ``config.zero_copy_min_bytes``, ``config.deadline_s`` and ``config.carries``: the
runtime tells the planner what its ops can carry and the policy obeys, so nothing downstream
re-decides. Version 3 added bundles: small static transfers of a step between the same two
devices that share one channel (``Transfer.bundle``, ``bundle_offset``; graph_pass.bundles).
Version 4 added ``Transfer.send_host``/``recv_host``: a half on a device that is not a CPU (a
GPU, a PluggableDevice, an XLA device) crosses via its task's CPU, where rdmadev's node runs.
The native side applies a plan and never re-decides: a transfer with ``decision == "swap"`` becomes
a write on ``send_task`` into ``region`` at ``offset`` and a wait on ``recv_task``; a ``"keep"``
transfer is left to TF's gRPC rendezvous. Offsets are authoritative on the receiving task, which
sends its region descriptor to the sender at setup.
"""

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from .devices import task_of
from .errors import ConfigError, PlanFormatError

__all__ = ["PLAN_SCHEMA", "PLAN_VERSION", "STATIC_SLOTS", "DYNAMIC_SLOTS", "DEFAULT_MAX_DYNAMIC_RANK", "CLIENT_JOBS",
           "DEFAULT_ZERO_COPY_MIN_BYTES", "DEFAULT_DEADLINE_S", "DEFAULT_BUNDLE_BELOW_BYTES", "CARRIES", "Config", "Transfer", "Region", "TaskBlock", "Plan", "channel_id", "channel_key"]

#: Schema name written into every serialized plan.
PLAN_SCHEMA = "rdmadev.plan"
#: Version of the schema; bump on any incompatible change (the native side refuses other versions).
#: 2: config gained zero_copy_min_bytes, deadline_s and carries.
#: 3: transfers gained bundle and bundle_offset (several share a channel), config bundle_below_bytes.
#: 4: transfers gained send_host and recv_host (a half on a device other than a CPU crosses via its task's CPU).
PLAN_VERSION = 4
#: Slots of a channel whose tensors have a static shape (and of a control signal): one. Such a
#: channel carries one tensor per step, and the steps rdmadev rewrites run one at a time per
#: instantiation (a tf.function call returns once all of its components finished;
#: ClusterCoordinator runs a worker's closures on a synchronous executor; a TF1 session run ends
#: when all of its partitions did), so the receiver has released step n's slot before the sender
#: writes step n+1's tensor: a second slot would only double what the receiver registers. The
#: sender still waits for the credit if it ever comes first, so the ring stays correct.
STATIC_SLOTS = 1
#: Slots of a dynamic channel (run-time shapes, half pairs): two, because a tensor larger than a
#: slot that its sender cannot stage streams through them in chunks (the sender writes chunk i+1
#: while the receiver copies chunk i), and a grown channel's move is announced in a slot of the
#: old ring while the receiver may still hold the last tensor's.
DYNAMIC_SLOTS = 2
#: Dims a dynamic channel's shape block holds when the rank itself is unknown. Rank 8 covers every
#: tensor of common models (conv kernels are rank 4, attention tensors rank 4-5); a larger rank at
#: run time fails the write with a clear error rather than corrupting the slot.
DEFAULT_MAX_DYNAMIC_RANK = 8
#: Jobs of the client/coordinator: pairs to or from them (arguments, return values) stay on gRPC
#: unless ``Config.plan_client_pairs`` is set.
CLIENT_JOBS = ("localhost", "chief")
#: Smallest swapped transfer whose receive slot may be handed to TF without a copy (zero-copy).
#: Below 64 KiB a copy out of the slot costs < 5 us on these machines (memcpy at 12.5-15 GB/s on
#: one core) and frees the slot for the sender at once, while an aliased slot is credited back
#: only when TF frees the tensor; aliasing pays only for large tensors.
DEFAULT_ZERO_COPY_MIN_BYTES = 64 << 10
#: Seconds any wait of a planned channel (a write waiting for credit, a wait for its slot, the
#: channel's setup) may take before it fails with DeadlineExceeded: the one default for every
#: wait. A wait that legitimately lasts long is a peer still building its first step (tracing,
#: partitioning and kernel construction of a large model take minutes on a 2 vCPU task) or a
#: slow step on the other side; 300 s covers both, while a dead peer is caught earlier by the
#: fabric's liveness checks, so the deadline only bounds what nothing else notices (never a hang).
DEFAULT_DEADLINE_S = 300.0
#: Largest static tensor (bytes, exclusive) that may share a channel with the other small tensors
#: of its step between the same two devices (a bundle, graph_pass.bundles): one extra copy of it
#: into the slot on its sender costs < 2 µs at memcpy speed here (10-15 GB/s on one core), an
#: order below the 11-19 µs a pair of its own costs; a larger one gains nothing from sharing.
DEFAULT_BUNDLE_BELOW_BYTES = 16 << 10
#: What the runtime's ops can carry, by capability; each False keeps such transfers on gRPC with
#: their own reason. A Config assumes neither unless told; rdmadev's bridge tells what its ops
#: carry (rdmadev.tf.bridge.OPS_CARRY: all, half pairs where a task's runtime meets them).
CARRIES = ("dynamic_shapes", "half_pairs", "dead_tensors", "loops")


def channel_id(tensor_name, send_device, recv_device, send_device_incarnation):
    """Derive a channel's identity from the rendezvous attrs alone (same on both halves).

    The identity is BLAKE2b with an 8-byte digest over the UTF-8 text
    ``tensor_name + "\\n" + send_device + "\\n" + recv_device + "\\n" + str(incarnation)`` (the
    incarnation as a signed decimal int64, exactly as the attr holds it), as 16 hex digits.

    Args:
        tensor_name: the pair's ``tensor_name`` attr, e.g. ``"edge_5_MatMul/ReadVariableOp"``.
        send_device: the ``send_device`` attr.
        recv_device: the ``recv_device`` attr.
        send_device_incarnation: the ``send_device_incarnation`` attr (int).

    Returns:
        A 16-character lowercase hex string.

    Example:
        >>> channel_id("edge_4_x", "/job:a/replica:0/task:0/device:CPU:0", "/job:b/replica:0/task:0/device:CPU:0", 1)
        '...'  # doctest: +SKIP
    """
    text = f"{tensor_name}\n{send_device}\n{recv_device}\n{int(send_device_incarnation)}"
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def channel_key(cid, instance_id):
    """Return the key naming a channel in a plan: ``cid`` alone, or ``cid@instance_id`` when given."""
    return f"{cid}@{instance_id}" if instance_id else cid


@dataclass
class Config:
    """Planner settings (all serialized into the plan).

    Attributes:
        slots: slots of every channel (K >= 1); None lets ``slots_for`` pick per channel
            (``STATIC_SLOTS`` or ``DYNAMIC_SLOTS``).
        client_jobs: jobs whose pairs stay on gRPC unless ``plan_client_pairs``.
        plan_client_pairs: plan pairs to/from ``client_jobs`` too.
        min_bytes: static transfers smaller than this stay on gRPC (0 = swap everything eligible).
        capacity_hints: upper bound in bytes for dynamic transfers, keyed by ``tensor_name`` or by
            the producing node's name (the ``_src`` attr).
        default_dynamic_capacity: capacity of every other dynamic transfer, or the bound TF's
            shapes give it (``Transfer.bound_bytes``) when that is smaller; None keeps those
            without a bound on gRPC.
        half_pair_capacity: when only one half of a pair is planned (TF1: each task rewrites its
            own half), both halves must decide from the attrs alone; None keeps such pairs on gRPC,
            a number swaps them as dynamic channels with this capacity.
        max_dynamic_rank: dims reserved in the shape block when a dynamic rank is unknown.
        zero_copy_min_bytes: smallest swapped transfer the receiver may alias (see
            ``DEFAULT_ZERO_COPY_MIN_BYTES``); ``zero_copy.mark_zero_copy`` reads it here.
        deadline_s: seconds every wait of the plan's channels may take (see ``DEFAULT_DEADLINE_S``).
        bundle_below_bytes: static tensors smaller than this share a channel with the other small
            tensors of their step between the same two devices (``graph_pass.bundles``;
            ``DEFAULT_BUNDLE_BELOW_BYTES``); 0 gives every pair its own channel.
        carries: ``{"dynamic_shapes": bool, "half_pairs": bool, "dead_tensors": bool,
            "loops": bool}``, what the runtime's ops can carry (the bridge passes it; missing
            keys are False). The policy keeps what they cannot carry, with reason
            ``not_carried_dynamic``, ``not_carried_half_pair``, ``in_cond`` or ``in_loop``.
            Carrying half pairs means carrying them as dynamic channels of
            ``half_pair_capacity``; carrying dead tensors, swapping the pairs in a
            conditional's branch (``Transfer.in_cond``) so that the branch not taken sends its
            deadness; carrying loops (with dead tensors), swapping the pairs in a while loop's
            frame (``Transfer.in_loop``): one transfer per iteration, in order, the exit
            iteration's dead.
    """

    slots: int = None
    client_jobs: tuple = CLIENT_JOBS
    plan_client_pairs: bool = False
    min_bytes: int = 0
    capacity_hints: dict = field(default_factory=dict)
    default_dynamic_capacity: int = None
    half_pair_capacity: int = None
    max_dynamic_rank: int = DEFAULT_MAX_DYNAMIC_RANK
    zero_copy_min_bytes: int = DEFAULT_ZERO_COPY_MIN_BYTES
    deadline_s: float = DEFAULT_DEADLINE_S
    bundle_below_bytes: int = DEFAULT_BUNDLE_BELOW_BYTES
    carries: dict = field(default_factory=lambda: dict.fromkeys(CARRIES, False))

    def __post_init__(self):
        self.client_jobs = tuple(self.client_jobs)
        self.capacity_hints = dict(self.capacity_hints)
        unknown = sorted(set(self.carries) - set(CARRIES))
        if unknown:
            raise ConfigError(f"carries has unknown capabilities {unknown}; known: {list(CARRIES)}")
        self.carries = {k: bool(self.carries.get(k, False)) for k in CARRIES}
        if isinstance(self.deadline_s, bool) or not isinstance(self.deadline_s, (int, float)) \
                or not self.deadline_s > 0:
            raise ConfigError(f"deadline_s={self.deadline_s!r}: must be a number of seconds > 0")
        self.deadline_s = float(self.deadline_s)
        if self.slots is not None and (not isinstance(self.slots, int) or isinstance(self.slots, bool)
                                       or self.slots < 1):
            raise ConfigError(f"slots={self.slots!r}: must be None (the planner picks) or an int >= 1")
        for name in ("min_bytes", "max_dynamic_rank", "zero_copy_min_bytes", "bundle_below_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be an int >= 0")
        for name in ("default_dynamic_capacity", "half_pair_capacity"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(f"{name}={v!r}: must be None or an int >= 0 (bytes)")
        for k, v in self.capacity_hints.items():
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"capacity_hints[{k!r}]={v!r}: must be an int >= 0 (bytes)")

    def slots_for(self, rank_capacity):
        """Slots of a swapped channel: ``slots`` when set, else by its kind (``rank_capacity`` is
        None for a static channel)."""
        if self.slots is not None:
            return self.slots
        return STATIC_SLOTS if rank_capacity is None else DYNAMIC_SLOTS


@dataclass
class Transfer:
    """One cross-task `_Send`/`_Recv` pair (or the half of it present), with its decision.

    Facts (set by ``find_transfers``): the rendezvous attrs, ``send_node``/``recv_node`` (None for
    the half not present), ``src``/``dst`` (original producer and consumer, from ``_src``/``_dst``),
    ``kind`` ("data" or "control"), ``dtype`` (name), ``shape`` (list, -1 = unknown dim; None =
    unknown rank), ``shape_source``, ``bytes`` (static size or None), ``bound`` and
    ``bound_bytes`` (for a run-time shape: a bound on every dim that TF's shapes give, from
    rdmadev's pass, and the bytes a tensor within it has; else None), ``in_loop`` (a half runs
    inside a while loop's frame: once per iteration), ``in_cond`` (a pair inside a branch of a
    lowered conditional: its tensor may be dead), ``send_host``/``recv_host`` (for a half on a
    device other than a CPU: its task's CPU, where rdmadev's node for it runs, the tensor
    crossing between the two by TF's own copy; else None).
    Decision (set by ``plan_regions``): ``decision`` ("swap"/"keep"), ``reason`` (a code of
    ``graph_pass.policy.REASONS``), ``detail`` (text), ``channel_key`` and, for swaps, the layout:
    ``region``, ``offset`` (in the region), ``task_offset`` (in the task block), ``slots``,
    ``slot_bytes``, ``payload_offset``, ``capacity_bytes``, ``rank_capacity`` (None = static);
    ``zero_copy`` (set by ``zero_copy.mark_zero_copy``: the receiver may alias the slot);
    ``bundle`` and ``bundle_offset`` (set by ``bundles.bundle_transfers`` for a small tensor
    that shares its channel with others of its step: the bundle's id and where the tensor
    starts in the slot's payload; its ``channel_key`` and layout are then the bundle's, the
    same on every member).
    """

    channel_id: str
    tensor_name: str
    send_device: str
    recv_device: str
    send_device_incarnation: int
    client_terminated: bool = False
    send_node: str = None
    recv_node: str = None
    send_op: str = None
    recv_op: str = None
    src: str = None
    dst: str = None
    kind: str = "data"
    dtype: str = "DT_INVALID"
    shape: list = None
    shape_source: str = "unknown"
    bytes: int = None
    bound: list = None
    bound_bytes: int = None
    in_loop: bool = False
    in_cond: bool = False
    send_host: str = None
    recv_host: str = None
    decision: str = None
    reason: str = None
    detail: str = None
    channel_key: str = None
    region: str = None
    offset: int = None
    task_offset: int = None
    slots: int = None
    slot_bytes: int = None
    payload_offset: int = None
    capacity_bytes: int = None
    rank_capacity: int = None
    zero_copy: bool = False
    bundle: str = None
    bundle_offset: int = None

    @property
    def send_task(self):
        """The sending task, ``/job:J/replica:R/task:T``."""
        return task_of(self.send_device)

    @property
    def recv_task(self):
        """The receiving task."""
        return task_of(self.recv_device)

    @property
    def via_host(self):
        """The device copies a step of this transfer makes: one per half that crosses through
        its task's CPU (``send_host``, ``recv_host``)."""
        return sum(1 for h in (self.send_host, self.recv_host) if h)

    @property
    def halves(self):
        """"both", "send" or "recv": which ends are in the planned graphs."""
        if self.send_node and self.recv_node:
            return "both"
        return "send" if self.send_node else "recv"

    @property
    def label(self):
        """A short human name: the node present on the sending side, else the receiving one."""
        return self.send_node or self.recv_node or self.tensor_name


@dataclass
class Region:
    """A receive region: the channels from one sending task into one receiving task."""

    region_id: str
    recv_task: str
    send_task: str
    offset: int
    bytes: int
    used_bytes: int
    channels: list = field(default_factory=list)


@dataclass
class TaskBlock:
    """Everything one receiving task registers for a plan: ``total_bytes`` over its ``regions``."""

    task: str
    total_bytes: int
    regions: list = field(default_factory=list)


def _build(cls, data, what):
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = required - set(data)
    if missing:
        raise PlanFormatError(f"{what} is missing {sorted(missing)}; re-create the plan with this graph_pass")
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Plan:
    """A complete plan for one instantiation (or one task's half, in TF1)."""

    transfers: list = field(default_factory=list)
    regions: list = field(default_factory=list)
    tasks: list = field(default_factory=list)
    config: Config = field(default_factory=Config)
    instance_id: str = None
    layout: dict = field(default_factory=dict)  # the Layout's to_dict() (plan_regions sets it)
    version: int = PLAN_VERSION
    schema: str = PLAN_SCHEMA

    def swapped(self):
        """Return the transfers with ``decision == "swap"``."""
        return [t for t in self.transfers if t.decision == "swap"]

    def kept(self):
        """Return the transfers left on gRPC."""
        return [t for t in self.transfers if t.decision != "swap"]

    def transfer(self, key):
        """Return the transfer whose ``channel_key`` or ``channel_id`` is ``key`` (KeyError if none)."""
        for t in self.transfers:
            if key in (t.channel_key, t.channel_id):
                return t
        raise KeyError(key)

    def to_dict(self):
        """Return the plan as plain JSON-ready data (keys as in the module docstring)."""
        return {"schema": self.schema, "version": self.version, "layout": dict(self.layout),
                "config": dataclasses.asdict(self.config), "instance_id": self.instance_id,
                "transfers": [dataclasses.asdict(t) for t in self.transfers],
                "regions": [dataclasses.asdict(r) for r in self.regions],
                "tasks": [dataclasses.asdict(b) for b in self.tasks]}

    def to_json(self, indent=None):
        """Serialize to a JSON string (stable key order)."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data):
        """Rebuild a plan from ``to_dict()`` output.

        Raises:
            PlanFormatError: wrong schema or version, or missing fields.
        """
        if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
            raise PlanFormatError(f"not an {PLAN_SCHEMA} document (schema={data.get('schema') if isinstance(data, dict) else None!r})")
        if data.get("version") != PLAN_VERSION:
            older = isinstance(data.get("version"), int) and data["version"] < PLAN_VERSION
            raise PlanFormatError(
                f"plan version {data.get('version')!r} is not supported (this graph_pass reads version "
                f"{PLAN_VERSION}{', which added bundles and halves via host' if older else ''}); "
                f"re-plan with the graph_pass that matches the native library")
        cfg = dict(data.get("config", {}))
        return cls(transfers=[_build(Transfer, t, "a transfer") for t in data.get("transfers", [])],
                   regions=[_build(Region, r, "a region") for r in data.get("regions", [])],
                   tasks=[_build(TaskBlock, b, "a task block") for b in data.get("tasks", [])],
                   config=_build(Config, cfg, "the config"), instance_id=data.get("instance_id"),
                   layout=dict(data.get("layout", {})), version=data["version"], schema=data["schema"])

    @classmethod
    def from_json(cls, text):
        """Parse ``to_json()`` output.

        Raises:
            PlanFormatError: not JSON, or not a plan of this version.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PlanFormatError(f"plan is not valid JSON: {exc}") from exc
        return cls.from_dict(data)
