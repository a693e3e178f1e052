"""Configuration from environment variables: the one place rdmadev reads them. Generic
settings are validated here, with messages that name the variable and the fix; the settings
of one fabric (RDMADEV_DEVICE, RDMADEV_PORT, RDMADEV_GID_INDEX, RDMADEV_ACK_TIMEOUT) travel
as that fabric's options (`Config.fabric_options()`, "<fabric>.<key>" -> text) and the fabric
validates them (the native core's <fabric>_options.h); `with_variable_names` makes its errors
name the variable.

Example:
    >>> cfg = Config.from_env({"RDMADEV_FABRIC": "tcp", "RDMADEV_SECRET": "s3cret",
    ...                        "RDMADEV_DEVICE": "rxe0"})
    >>> cfg.fabric, cfg.fabric_options()
    ('tcp', {'verbs.device': 'rxe0'})
"""
import dataclasses
import functools
import logging
import os
import resource

from .errors import ConfigError

__all__ = ["Config", "VARIABLES", "FABRIC_CHOICES", "FABRIC_OPTION_VARIABLES", "with_variable_names",
           "default_max_registered_bytes", "fabrics_may_open", "locked_memory",
           "physical_memory", "memlock_holds", "VERBS_STAGING_BYTES", "RAISE_MEMLOCK",
           "size_text", "SYSFS_IB", "CAP_IPC_LOCK"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

FABRIC_CHOICES = ("auto", "shm", "tcp", "verbs")

# (variable, default shown in docs, meaning). docs/operating/configuration.md's table is
# generated from this list (python docs/tools/env_table.py); tests/test_docs.py fails when it is
# stale.
VARIABLES = (
    ("RDMADEV_FABRIC", "auto", "Fabric for every peer: auto (best both ends reach: shm > verbs > tcp), shm, tcp or verbs."),
    ("RDMADEV_SLOTS", "the planner's", "Slots of every channel ring (>= 1): how many transfers may be in flight before the sender waits for a credit. By default the planner gives a static-shape channel 1 (one tensor per step, released before the next step writes) and a run-time-shape channel 2 (its chunks stream through them)."),
    ("RDMADEV_SPIN_US", "20", "Microseconds a waiter spins before yielding, and the tcp fabric's receiver thread polls for the next frame while frames keep coming: a spin-polled word is seen in ~0.2 us, a sleeping waiter pays ~30 us to wake here."),
    ("RDMADEV_YIELD_US", "200", "Microseconds a waiter then yields the core (sched_yield) before it sleeps with backoff (at most 100 us per sleep)."),
    ("RDMADEV_DEADLINE_S", "300", "Seconds any wait or transfer may take before it fails with DeadlineExceeded (never a hang)."),
    ("RDMADEV_LIVENESS_S", "10", "Seconds a peer task may leave rdmadev's heartbeats unanswered (it is stopped, overloaded or cut off) before it is reported silent: a warning naming it, the counters' silent_peers, and the message of a wait on it that reaches RDMADEV_DEADLINE_S. Waits on it go on, as TF's own do, and its step finishes once it answers. 0 turns heartbeats off."),
    ("RDMADEV_SECRET", "(generated)", "Cluster secret every task shares; the tcp fabric authenticates peers with HMAC-SHA256 over it. Generated per process if unset, which only suits single-process use."),
    ("RDMADEV_SECRET_FILE", "(unset)", "File holding the cluster secret (instead of RDMADEV_SECRET)."),
    ("RDMADEV_TCP_ADDR", "127.0.0.1:0", "host:port the tcp fabric of a Domain opened by rdmadev.open_domain listens on and advertises; host must be an address peers can reach (port 0 = any free port). The verbs fabric's connection side channel listens on the same host (any port). A task (`rdmadev serve`, the grpc+rdmadev protocol) listens on the host of its cluster-spec address instead, on a port the kernel picks: a firewall between hosts must pass the ephemeral range."),
    ("RDMADEV_ENABLED", "1", "0 turns rdmadev off everywhere: optimize() and RDMADEV_AUTO leave every function on TF's gRPC path."),
    ("RDMADEV_PLUGIN", "1", "0 keeps rdmadev's loader in site-packages/tensorflow-plugins/ inactive: `import tensorflow` then registers no grpc+rdmadev protocol (`rdmadev serve` still loads it)."),
    ("RDMADEV_AUTO", "0", "1 rewrites every function instantiated in the process (in tasks started by `rdmadev serve`: functions they partition, e.g. ParameterServerStrategy steps), so scripts run unchanged."),
    ("RDMADEV_MAX_REGISTERED_BYTES", "(half of RAM; on verbs, at most half the memlock limit)", "Bytes of channel regions a task registers at most (all its peers together; a K/M/G/T suffix counts in 1024s), a budget: a setup request past it is refused, and the process that planned it then releases the channels of its instantiations called longest ago that hold memory on that task and asks again (an evicted one is set up again before it next runs; `evicted`, `set_up_again` in rdmadev.counters()). With nothing of its own left to release there, the instantiation stays on TF's gRPC path with a WARNING (`over_budget` in its report), and a TF1 half pair past the receiving task's budget likewise (`half_kept_on_tf`); a setup request outside a plan fails with a RegionError naming this variable (after waiting up to 10.5 s when part of that memory is kept by unbound halves for their peer: a sending half parked until its receiver took its last transfer, a verbs ring retired for late writes after a broken connection), and a sender with no room left for a stage sends a tensor larger than its slots in chunks instead. The default is half of physical memory; where the task may open verbs (RDMADEV_FABRIC=verbs, or auto on a host whose kernel lists an RDMA device in /sys/class/infiniband), lacks CAP_IPC_LOCK and has a finite locked-memory hard limit (`ulimit -Hl`), it is also at most the smaller of half that limit and the limit less 4 MiB, and at least 4 KiB, with one WARNING: verbs pins every region registered, and the rest of the limit is left for the 4 MiB staging buffer verbs pins outside this budget for each peer a task writes to. A value set here wins; on verbs, one that does not fit in the limit beside one such staging buffer gets a WARNING naming both."),
    ("RDMADEV_DYNAMIC_CAPACITY", "1M", "Payload bytes each slot of a channel whose tensor has a shape known only at run time starts with (ids after tf.unique, gathered rows, sparse gradients; a K/M/G suffix counts in 1024s), unless TF's shapes bound the tensor below it: then its slots hold that bound (the report says `slots of N B (its bound from TF's shapes)`). The shape travels with the tensor; one larger than a slot is staged by its sender and read by the receiver (`staged` in rdmadev.counters()) or sent in slot-sized chunks (RDMADEV_STAGE_BELOW_SLOT_BYTES), and the receiving task then moves the channel to slots that hold it and a quarter more, up to 4 MiB (`grown`), within RDMADEV_MAX_REGISTERED_BYTES. A starting size, never a limit."),
    ("RDMADEV_STAGE_BELOW_SLOT_BYTES", "1M", "A tensor of a run-time shape larger than its channel's slots is staged when the slots hold fewer than this many bytes (K/M/G/T suffix): its sender copies it whole into a region of its own and the receiver reads it from there in one go (a one-sided read). From this slot size on it goes in slot-sized chunks through the ring instead, where the sender's copy of one chunk overlaps the receiver's copy of the last. 0 never stages."),
    ("RDMADEV_ZERO_COPY_MIN_BYTES", "64K", "Bytes a received tensor must carry for its receive to hand TF the slot itself instead of a copy (K/M/G/T suffix), where the planner found that every consumer of the tensor keeps nothing (`+zc` in the report); the slot goes back to the sender when TF frees the tensor. A tensor that was staged or came in chunks is always copied; a value above every tensor (e.g. 1T) turns aliasing off."),
    ("RDMADEV_BUNDLE_BELOW_BYTES", "16K", "Static tensors smaller than this (K/M/G/T suffix) share one channel with the other small tensors of their step between the same two devices, a bundle: one write and one wait move them all (`bundle` in the report), except where one of them may depend on another's arrival, in a function with a while loop, in a conditional's branch. A bundle's tensors are copied, never aliased. 0 gives every pair its own channel."),
    ("RDMADEV_MAX_TENSOR_BYTES", "2G", "Bytes one tensor of a run-time shape may carry (K/M/G/T suffix): a larger one fails its step with an error naming this variable, and a peer claiming more cannot make the receiver allocate it. Set the same value on every task."),
    ("RDMADEV_CONTROL_PORT_OFFSET", "10000", "rdmadev's control service of a task listens at the task's TF port + this offset (minus it when that passes 65535), on the host of its cluster-spec address: TCP for its control connections, UDP for its heartbeats."),
    ("RDMADEV_DEVICE", "(auto)", "RDMA device for the verbs fabric (e.g. mlx5_0, rxe0); default: the first device with an ACTIVE port."),
    ("RDMADEV_PORT", "(auto)", "Port of RDMADEV_DEVICE (1-based); default: its first ACTIVE port."),
    ("RDMADEV_GID_INDEX", "(auto)", "GID index on RoCE; default: the first RoCE v2 GID holding an IPv4 address, then other RoCE v2, then RoCE v1 (`rdmadev doctor` lists them)."),
    ("RDMADEV_ACK_TIMEOUT", "16", "The verbs queue pairs' local ACK timeout, as the InfiniBand exponent n of 4.096 us * 2^n (1-18; 16 = 268 ms): a write not acknowledged within it is sent again, 6 times at most, and then fails its transfer, naming the peer as lost. Raise it (to 18 = 1.07 s) for Soft-RoCE (rdma_rxe) on loaded hosts, whose kernels acknowledge late: each timeout resends every unacknowledged packet, which loads the peer further. At most 18, so that a write lands or fails within 7.5 s, inside the 10 s a released channel's memory stays registered for late writes."),
)

# (variable, fabric option it sets, Config field holding its text). Read here, validated
# by the fabric that owns the option.
FABRIC_OPTION_VARIABLES = (
    ("RDMADEV_DEVICE", "verbs.device", "device"),
    ("RDMADEV_PORT", "verbs.port", "port"),
    ("RDMADEV_GID_INDEX", "verbs.gid_index", "gid_index"),
    ("RDMADEV_ACK_TIMEOUT", "verbs.ack_timeout", "ack_timeout"),
)

# Bytes the verbs fabric pins outside RDMADEV_MAX_REGISTERED_BYTES for each peer a task writes
# to: the staging buffer of its endpoint (kStagingBytes, _native/core/verbs/verbs_send_queue.h).
# A copy, so that reading a Config loads no native code; tests/test_config.py checks it against
# the bindings' rdmadev._core.VERBS_STAGING_BYTES.
VERBS_STAGING_BYTES = 4 << 20
# The least default RDMADEV_MAX_REGISTERED_BYTES: one page, the least the verbs fabric
# registers. 0 would mean "no limit" to the native domain (domain.h), the opposite of a
# locked-memory limit too small to pin anything.
MIN_DEFAULT_MAX_REGISTERED_BYTES = 4 << 10
# Where the kernel lists RDMA devices: with none, libibverbs finds none and RDMADEV_FABRIC=auto
# cannot open verbs (rdmadev.cluster.facts reads the devices from here too).
SYSFS_IB = "/sys/class/infiniband"
# Bit of CAP_IPC_LOCK in /proc/self/status's CapEff (<linux/capability.h>): a process with it
# may lock any amount of memory, whatever RLIMIT_MEMLOCK says.
CAP_IPC_LOCK = 14
# Default RDMADEV_DYNAMIC_CAPACITY: a slot holds the rows an embedding lookup of 4096 unique
# ids x 64 floats gathers, and K = 2 such slots cost a receiver 2 MiB per dynamic channel.
DEFAULT_DYNAMIC_CAPACITY = 1 << 20
# Default RDMADEV_STAGE_BELOW_SLOT_BYTES: where staging a tensor larger than a slot stops paying.
# A chunk costs a credit round trip (on tcp a frame back and a thread wake-up, ~60 us here) but
# lets the sender copy chunk i+1 while the receiver copies chunk i; a stage is one transfer, but
# the receiver reads it only after the sender copied all of it. benchmarks/staged.py, same run,
# staged time / chunked time on shm and tcp: 0.42-0.92 with 64 KiB slots, 0.95-1.25 with 1 MiB,
# 1.01-1.75 with 4 MiB (the largest slots growth gives; 8-128 MiB tensors).
DEFAULT_STAGE_BELOW_SLOT_BYTES = 1 << 20
# Default RDMADEV_MAX_TENSOR_BYTES: what TF's own gRPC path carries in one tensor message.
DEFAULT_MAX_TENSOR_BYTES = 2 << 30
# Suffixes RDMADEV_MAX_REGISTERED_BYTES takes (binary units).
_SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

# One slot is a ring too: the sender waits for each release before its next write.
MIN_SLOTS = 1
# More than this many slots only multiplies registered memory; nothing gains from it.
MAX_SLOTS = 64


def _number(env, name, default, kind, low, high):
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number",
                          hint=f"set {name} to a {kind.__name__} in [{low}, {high}]") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={text!r} is out of range",
                          hint=f"set {name} to a value in [{low}, {high}]")
    return value


def _size(env, name, default, zero=False):
    """A byte count: digits with an optional K, M, G or T suffix (powers of 1024); 0 only
    where `zero` (a variable for which 0 turns something off)."""
    text = env.get(name, "").strip()
    if not text:
        return default
    digits, unit = (text[:-1], _SIZE_SUFFIXES[text[-1].upper()]) \
        if text[-1].upper() in _SIZE_SUFFIXES else (text, 1)
    if not digits.isdigit() or (int(digits) == 0 and not zero):
        raise ConfigError(f"{name}={text!r} is not a {'' if zero else 'positive '}byte count",
                          hint=f"set {name} to a number of bytes, e.g. 8G or 8589934592")
    return int(digits) * unit


def physical_memory():
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fabrics_may_open(fabric):
    """The fabrics a task whose RDMADEV_FABRIC is `fabric` may open: that one, or for "auto"
    every fabric (it opens the viable ones), verbs only where the kernel lists an RDMA device."""
    if fabric != "auto":
        return (fabric,)
    try:
        rdma = bool(os.listdir(SYSFS_IB))
    except OSError:
        rdma = False
    return tuple(f for f in FABRIC_CHOICES if f != "auto" and (f != "verbs" or rdma))


def locked_memory():
    """(this process's RLIMIT_MEMLOCK hard limit in bytes, None when unlimited; whether it has
    CAP_IPC_LOCK, which exempts it from the limit). The hard limit, since a task raises its soft
    limit to it when it starts (rdmadev/cluster/limits.py)."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    caps = 0
    try:
        with open("/proc/self/status") as f:
            caps = next((int(line.split()[1], 16) for line in f if line.startswith("CapEff:")), 0)
    except OSError:
        pass
    return (None if hard == resource.RLIM_INFINITY else hard), bool(caps >> CAP_IPC_LOCK & 1)


def default_max_registered_bytes(physical_bytes, fabrics, memlock_hard, ipc_lock):
    """The default RDMADEV_MAX_REGISTERED_BYTES of a task.

    Half of physical memory, so neither a plan too big for the host nor a peer asking for
    huge regions can take a task's memory from under TF itself. A task that may open verbs
    pins every region it registers (ibv_reg_mr), so where its locked-memory hard limit is
    finite and it lacks CAP_IPC_LOCK, the budget is also at most the limit less a reserve for
    what verbs pins outside the budget, a 4 MiB staging buffer for each peer the task writes
    to (VERBS_STAGING_BYTES). The reserve is half the limit, and at least one staging buffer:
    an 8 MiB limit (Linux's default since 5.16) gives a 4 MiB budget and room for one peer's
    staging, 1 GiB gives 512 MiB and 128 peers'. The budget then binds before a registration
    fails on the limit: past it the planner evicts idle instantiations or keeps one on TF's
    gRPC path with a WARNING. Below 4 MiB + 4 KiB a limit cannot pin one staging buffer
    beside anything, so a verbs connection fails on it (a RegionError naming RLIMIT_MEMLOCK);
    the budget is then MIN_DEFAULT_MAX_REGISTERED_BYTES, which keeps every plan over budget,
    on gRPC with a WARNING.

    Args:
        physical_bytes: the machine's memory (physical_memory()).
        fabrics: the fabrics the task may open (fabrics_may_open()).
        memlock_hard: its locked-memory hard limit in bytes; None: unlimited.
        ipc_lock: whether it has CAP_IPC_LOCK (then no limit applies).
    Returns:
        int, bytes.
    Example:
        >>> default_max_registered_bytes(24 << 30, ("verbs",), 8 << 20, False)
        4194304
        >>> default_max_registered_bytes(24 << 30, ("shm", "tcp"), 8 << 20, False)
        12884901888
    """
    budget = physical_bytes // 2
    if "verbs" in fabrics and memlock_hard is not None and not ipc_lock:
        reserve = max(memlock_hard // 2, VERBS_STAGING_BYTES)
        budget = min(budget, max(memlock_hard - reserve, MIN_DEFAULT_MAX_REGISTERED_BYTES))
    return budget


def memlock_holds(budget, memlock_hard):
    """Whether a locked-memory hard limit (None: unlimited) holds a task's registered regions,
    `budget` bytes at most, and the staging buffer of at least one verbs peer."""
    return memlock_hard is None or budget + VERBS_STAGING_BYTES <= memlock_hard


def size_text(n):
    """`n` bytes for a message: "1.5 GiB", "4.0 MiB", "64 KiB", "100 bytes"."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB")):
        if n >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


#: How to raise a locked-memory limit, for messages.
RAISE_MEMLOCK = ("raise the locked-memory limit where the task starts (`ulimit -l unlimited`, "
                 "memlock in /etc/security/limits.conf, LimitMEMLOCK=infinity for systemd, "
                 "--ulimit memlock=-1 for docker)")


def _max_registered_bytes(fabric, explicit):
    """(RDMADEV_MAX_REGISTERED_BYTES of a task of this machine whose RDMADEV_FABRIC is
    `fabric`: `explicit` when set, else the default; a warning when its locked-memory limit
    lowered the default or does not hold `explicit` on verbs, else None)."""
    fabrics = fabrics_may_open(fabric)
    hard, ipc_lock = locked_memory() if "verbs" in fabrics else (None, False)
    physical = physical_memory()
    default = default_max_registered_bytes(physical, fabrics, hard, ipc_lock)
    if explicit is None:
        if default == physical // 2:
            return default, None
        staging = size_text(VERBS_STAGING_BYTES)
        why = (f"; the rest of it is left for the {staging} staging buffer verbs pins for "
               f"each peer a task writes to ({(hard - default) // VERBS_STAGING_BYTES} here); "
               f"past the budget idle instantiations are evicted, and what still does not fit "
               f"stays on TF's gRPC path" if memlock_holds(default, hard) else
               f", too small to pin one verbs peer's {staging} staging buffer: verbs "
               f"connections fail on it, and instantiations stay on TF's gRPC path")
        return default, (
            f"rdmadev: RDMADEV_MAX_REGISTERED_BYTES defaults to {size_text(default)} here, not "
            f"half of RAM: the verbs fabric pins what a task registers, and this process's "
            f"locked-memory hard limit is {size_text(hard)}{why}. Fix: {RAISE_MEMLOCK}, or "
            f"set RDMADEV_FABRIC to shm or tcp where verbs is not used")
    if ipc_lock or memlock_holds(explicit, hard):
        return explicit, None
    smaller = (f", or set RDMADEV_MAX_REGISTERED_BYTES to at most {hard - VERBS_STAGING_BYTES}"
               if hard > VERBS_STAGING_BYTES else "")
    return explicit, (
        f"rdmadev: RDMADEV_MAX_REGISTERED_BYTES={explicit} ({size_text(explicit)}) and one verbs "
        f"peer's {size_text(VERBS_STAGING_BYTES)} staging buffer do not fit in this process's "
        f"locked-memory hard limit of {size_text(hard)}: on verbs, registrations fail on the limit "
        f"before the budget binds. Fix: {RAISE_MEMLOCK}{smaller}")


@functools.lru_cache(maxsize=None)
def _warn_once(message):
    log.warning("%s", message)


def _flag(env, name, default):
    text = env.get(name, "").strip()
    if not text:
        return default
    if text not in ("0", "1"):
        raise ConfigError(f"{name}={text!r} is not 0 or 1", hint=f"set {name} to 0 or 1")
    return text == "1"


@dataclasses.dataclass(frozen=True)
class Config:
    """Validated settings (see VARIABLES for their meaning)."""

    fabric: str = "auto"
    slots: int = None  # None: the planner's per channel (graph_pass.Config.slots_for)
    spin_us: float = 20.0
    yield_us: float = 200.0
    deadline_s: float = 300.0
    liveness_s: float = 10.0
    secret: bytes = b""
    tcp_addr: str = "127.0.0.1:0"
    # Fabric options (see FABRIC_OPTION_VARIABLES): None = unset (the fabric chooses);
    # otherwise the text (or a number) the fabric parses.
    device: object = None
    port: object = None
    gid_index: object = None
    ack_timeout: object = None
    enabled: bool = True
    auto: bool = False
    control_port_offset: int = 10000
    # None: the default for this machine and fabric (default_max_registered_bytes), filled in
    # when the Config is built.
    max_registered_bytes: int = None
    dynamic_capacity: int = DEFAULT_DYNAMIC_CAPACITY
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES
    stage_below_slot_bytes: int = DEFAULT_STAGE_BELOW_SLOT_BYTES
    # None: the planner's default (graph_pass.plan.DEFAULT_ZERO_COPY_MIN_BYTES, where it is
    # explained; not imported here, which would load the planner with every Config).
    zero_copy_min_bytes: object = None
    # None: the planner's default (graph_pass.plan.DEFAULT_BUNDLE_BELOW_BYTES).
    bundle_below_bytes: object = None

    def __post_init__(self):
        if self.max_registered_bytes is None:
            budget, _ = _max_registered_bytes(self.fabric, None)
            object.__setattr__(self, "max_registered_bytes", budget)

    @classmethod
    def from_env(cls, env=None):
        """Reads and validates every RDMADEV_* variable.

        Args:
            env: a mapping (default os.environ).
        Returns:
            Config.
        Raises:
            ConfigError: naming the variable, its value and the fix.
        """
        env = os.environ if env is None else env
        fabric = env.get("RDMADEV_FABRIC", "auto").strip().lower() or "auto"
        if fabric not in FABRIC_CHOICES:
            raise ConfigError(f"RDMADEV_FABRIC={fabric!r} is not a fabric",
                              hint=f"choose one of {', '.join(FABRIC_CHOICES)}")
        secret = env.get("RDMADEV_SECRET", "").encode()
        secret_file = env.get("RDMADEV_SECRET_FILE", "").strip()
        if secret and secret_file:
            raise ConfigError("both RDMADEV_SECRET and RDMADEV_SECRET_FILE are set",
                              hint="set only one of them")
        if secret_file:
            try:
                with open(secret_file, "rb") as f:
                    secret = f.read().strip()
            except OSError as e:
                raise ConfigError(f"RDMADEV_SECRET_FILE={secret_file!r} cannot be read: {e.strerror}",
                                  e.errno, "point it at a readable file holding the secret") from None
            if not secret:
                raise ConfigError(f"RDMADEV_SECRET_FILE={secret_file!r} is empty",
                                  hint="write the cluster secret into it")
        tcp_addr = env.get("RDMADEV_TCP_ADDR", "127.0.0.1:0").strip()
        host, sep, port = tcp_addr.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"RDMADEV_TCP_ADDR={tcp_addr!r} is not host:port",
                              hint="set it to an address of this host, e.g. 10.0.0.5:0")
        budget, warning = _max_registered_bytes(
            fabric, _size(env, "RDMADEV_MAX_REGISTERED_BYTES", None))
        if warning:
            _warn_once(warning)
        return cls(
            fabric=fabric,
            slots=_number(env, "RDMADEV_SLOTS", None, int, MIN_SLOTS, MAX_SLOTS),
            spin_us=_number(env, "RDMADEV_SPIN_US", 20.0, float, 0.0, 1e6),
            yield_us=_number(env, "RDMADEV_YIELD_US", 200.0, float, 0.0, 1e7),
            deadline_s=_number(env, "RDMADEV_DEADLINE_S", 300.0, float, 0.001, 1e7),
            liveness_s=_number(env, "RDMADEV_LIVENESS_S", 10.0, float, 0.0, 1e7),
            secret=secret,
            tcp_addr=tcp_addr,
            **{field: env.get(var, "").strip() or None for var, _, field in FABRIC_OPTION_VARIABLES},
            enabled=_flag(env, "RDMADEV_ENABLED", True),
            auto=_flag(env, "RDMADEV_AUTO", False),
            control_port_offset=_number(env, "RDMADEV_CONTROL_PORT_OFFSET", 10000, int, 1, 65534),
            max_registered_bytes=budget,
            dynamic_capacity=_size(env, "RDMADEV_DYNAMIC_CAPACITY", DEFAULT_DYNAMIC_CAPACITY),
            max_tensor_bytes=_size(env, "RDMADEV_MAX_TENSOR_BYTES", DEFAULT_MAX_TENSOR_BYTES),
            stage_below_slot_bytes=_size(env, "RDMADEV_STAGE_BELOW_SLOT_BYTES",
                                         DEFAULT_STAGE_BELOW_SLOT_BYTES, zero=True),
            zero_copy_min_bytes=_size(env, "RDMADEV_ZERO_COPY_MIN_BYTES", None),
            bundle_below_bytes=_size(env, "RDMADEV_BUNDLE_BELOW_BYTES", None, zero=True),
        )

    def fabric_options(self):
        """The fabric-specific settings, as the native fabrics take them.

        Returns:
            dict "<fabric>.<key>" -> text, only the settings that are set, e.g.
            {"verbs.device": "rxe0", "verbs.port": "1"}.
        """
        return {key: str(getattr(self, field)) for _, key, field in FABRIC_OPTION_VARIABLES
                if getattr(self, field) is not None}


def with_variable_names(error, config):
    """`error` (a ConfigError from a fabric) restated in terms of the variable that set the
    option it names, so the user sees the name they typed.

    Args:
        error: ConfigError raised by the native core (its message names "<fabric>.<key>").
        config: the Config whose fabric_options() reached the fabric.
    Returns:
        a ConfigError naming the variable, or `error` itself when it names no option.
    Example:
        >>> with_variable_names(ConfigError("option verbs.port='x' is bad"), Config(port="x"))
        ConfigError("RDMADEV_PORT='x' is invalid: option verbs.port='x' is bad")
    """
    message = str(error.args[0]) if error.args else ""
    options = config.fabric_options()
    for var, key, _ in FABRIC_OPTION_VARIABLES:
        if key in options and (f"{key}=" in message or f"'{key}'" in message):
            hint = error.hint.replace(key, var)
            return ConfigError(f"{var}={options[key]!r} is invalid: {message}", error.errno, hint)
    return error
