"""What one end of a pair knows about itself, as `rdmadev doctor --peer` judges a pair by it: a
task serves it as its "facts" control request (Runtime.handle), the doctor gathers its own side
the same way (rdmadev/tools/doctor_peer.py), and `rdmadev doctor` lists this host's RDMA ports
from the same sysfs readers.

Layers above add facts of their own with `provide` (the TF layer: which functions the task's
partition pass rewrites), so that this module imports nothing above rdmadev.cluster.

Example:
    >>> facts(Config(), domain)["address"]
    'shm=2daf...:25796;tcp=127.0.0.1:37085'
"""
import importlib.metadata
import ipaddress
import os
import resource
import socket

from ..config import SYSFS_IB, locked_memory
from ..device import fabric_report

__all__ = ["SYSFS_IB", "rdma_devices", "rdma_ports", "reach", "versions", "facts", "provide"]

_providers = {}  # name -> callable giving that fact (provide)


def provide(name, fn):
    """Adds fact `name`, `fn()` at each call of facts(): for layers above this one."""
    _providers[name] = fn


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _gid_kind(gid, gid_type):
    """'RoCE v2, IPv4 10.9.9.1' / 'RoCE v1, IPv6' / 'IB' for one GID."""
    addr = ipaddress.IPv6Address(gid)
    v4 = addr.ipv4_mapped
    family = f"IPv4 {v4}" if v4 else ("IPv6 link-local" if addr.is_link_local else "IPv6")
    return f"{gid_type or 'type unknown'}, {family}"


def rdma_devices():
    """The RDMA devices the kernel has (sysfs), [] if none."""
    try:
        return sorted(os.listdir(SYSFS_IB))
    except OSError:
        return []


def rdma_ports(devices=None):
    """The ports of `devices` (default: every one), their state and non-empty GIDs, from sysfs
    (what the verbs fabric chooses from; it prefers RoCE v2 GIDs holding an IPv4 address)."""
    out = []
    for dev in rdma_devices() if devices is None else devices:
        ports_dir = os.path.join(SYSFS_IB, dev, "ports")
        try:
            port_names = sorted(os.listdir(ports_dir), key=int)
        except (OSError, ValueError):
            continue
        for port in port_names:
            base = os.path.join(ports_dir, port)
            gids = []
            try:
                indexes = sorted(os.listdir(os.path.join(base, "gids")), key=int)
            except (OSError, ValueError):
                indexes = []
            for i in indexes:
                gid = _read(os.path.join(base, "gids", i))
                if not gid or set(gid) <= {"0", ":"}:
                    continue
                gid_type = _read(os.path.join(base, "gid_attrs", "types", i))
                netdev = _read(os.path.join(base, "gid_attrs", "ndevs", i))
                gids.append({"index": int(i), "gid": gid, "type": gid_type, "netdev": netdev,
                             "kind": _gid_kind(gid, gid_type)})
            out.append({"device": dev, "port": int(port), "state": _read(os.path.join(base, "state")),
                        "link_layer": _read(os.path.join(base, "link_layer")),
                        "gids": gids})
    return out


def _memlock():
    """This process's RLIMIT_MEMLOCK (None = unlimited) and whether CAP_IPC_LOCK exempts it."""
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    hard, ipc_lock = locked_memory()
    return {"soft": None if soft == resource.RLIM_INFINITY else soft, "hard": hard,
            "ipc_lock": ipc_lock}


def reach(address, fabric):
    """The reach of `fabric` in a domain address ("shm=...;tcp=h:p"), or None."""
    for item in address.split(";"):
        name, _, where = item.partition("=")
        if name == fabric:
            return where
    return None


def _active_mtu(device, port):
    """The port's active MTU in bytes, from libibverbs through Debian's python3-pyverbs
    (sysfs does not have it), or None without pyverbs."""
    try:
        from pyverbs.device import Context
    except ImportError:
        return None
    try:
        with Context(name=device) as ctx:
            return 128 << int(ctx.query_port(port).active_mtu)  # IBV_MTU_256 = 1 ... 4096 = 5
    except Exception:  # pyverbs' own errors: the MTU stays unknown
        return None


def _verbs_port(address):
    """The device, port and GID the verbs fabric of the domain at `address` uses: its reach
    ends in its GID, found here among the ports sysfs lists, with the GID's type, link layer
    and netdev; None when the domain has no verbs fabric."""
    where = reach(address, "verbs")
    if where is None:
        return None
    gid = ipaddress.IPv6Address(where.rsplit("/", 1)[1])
    for port in rdma_ports():
        for g in port["gids"]:
            if ipaddress.IPv6Address(g["gid"]) != gid:
                continue
            mtu = _read(f"/sys/class/net/{g['netdev']}/mtu") if g["netdev"] else None
            return {"device": port["device"], "port": port["port"], "gid_index": g["index"],
                    "gid": str(gid), "link_layer": port["link_layer"], "gid_type": g["type"],
                    "netdev": g["netdev"], "netdev_mtu": int(mtu) if mtu else None,
                    "active_mtu": _active_mtu(port["device"], port["port"])}
    return {"device": None, "gid": str(gid)}


def versions():
    """{"rdmadev": the installed rdmadev's version, "tensorflow": the TF its libraries were
    built against (setup.py's record; None when not built)}. The version is the installed
    distribution's: the package's own __init__ imports the TF layer, above this one."""
    try:
        version = importlib.metadata.version("rdmadev")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        from .._build_info import TF_VERSION
    except ImportError:
        TF_VERSION = None
    return {"rdmadev": version, "tensorflow": TF_VERSION}


def facts(config, domain, task=None):
    """One end's facts, JSON-able.

    Args:
        config: the end's Config (fabric choice and options, registered-bytes budget).
        domain: its open Domain, or None (a coordinator has none).
        task: its task name, or None.
    Returns:
        dict: rdmadev and TensorFlow (built against) versions, hostname, RDMADEV_FABRIC,
        every fabric's viability with its reason, the domain's address (the fabrics it opened
        and their reach; shm's holds the kernel's boot id and the pid namespace), memlock,
        the registered-bytes budget, the verbs port in use, and what the layers above
        provide ("pass_mode" where the TF layer is loaded).
    """
    address = domain.address if domain is not None else ""
    return {"task": task, **versions(), "hostname": socket.gethostname(),
            "fabric_setting": config.fabric,
            "fabrics": [{"fabric": n, "viable": ok, "reason": why}
                        for n, ok, why in fabric_report(config)],
            "address": address, "memlock": _memlock(),
            "max_registered_bytes": config.max_registered_bytes,
            "verbs": _verbs_port(address),
            **{name: fn() for name, fn in sorted(_providers.items())}}
