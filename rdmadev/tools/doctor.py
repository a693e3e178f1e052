"""`rdmadev doctor`: what this machine offers rdmadev, and why a fabric is not viable.

Example:
    $ rdmadev doctor
    $ rdmadev doctor --json
    $ rdmadev doctor --peer 10.0.0.2:2222    # the path to that task (doctor_peer.py)
"""
import importlib.metadata
import json
import os
import resource

from .. import _core
from ..config import Config
from ..cluster import facts, open_files
from ..device import fabric_report
from ..errors import ConfigError
from ..tf import ops, protocol
from ..tf.startup import import_tensorflow

__all__ = ["collect", "main"]


def _memlock():
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else f"{v // 1024} KiB"
    note = ("a task raises its soft limit to the hard one when it starts; the verbs fabric pins "
            "every region it registers, so the hard limit must exceed the sum of a task's region "
            "sizes (plus 4 MiB of staging per verbs endpoint); raise it with `ulimit -l "
            "unlimited`, memlock in /etc/security/limits.conf, LimitMEMLOCK=infinity for systemd or --ulimit "
            "memlock=-1 for docker (root with CAP_IPC_LOCK is exempt)"
            if hard != resource.RLIM_INFINITY else "")
    return {"soft": show(soft), "hard": show(hard), "note": note}


def _open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else str(v)
    peers = open_files.peers_served(hard)
    note = ("a task raises its soft limit to the hard one when it starts; it holds about "
            f"{open_files.DESCRIPTORS_PER_PEER} descriptors per peer task it exchanges tensors "
            "with, so the hard limit serves " + (f"about {peers}" if peers is not None
                                                 else "any number of") + " peer tasks")
    return {"soft": show(soft), "hard": show(hard), "note": note}


def _dev_shm():
    try:
        st = os.statvfs("/dev/shm")
    except OSError as e:
        return {"size": None, "note": f"/dev/shm unavailable ({e.strerror}); rdmadev's shm "
                                      "fabric uses memfd and does not need it"}
    return {"size": f"{st.f_blocks * st.f_frsize / 2**30:.1f} GiB",
            "free": f"{st.f_bavail * st.f_frsize / 2**30:.1f} GiB",
            "note": "rdmadev's shm regions are memfds: nothing is ever left in /dev/shm"}


def _verbs():
    """Every RDMA device, port and GID of this host. Whether the verbs fabric can use one
    (libibverbs loaded, a device with an ACTIVE port and a usable GID) is the core's verdict,
    in "fabrics"; the core's bindings do not list what it enumerates, so these come from
    sysfs, where the core reads GID types too."""
    devices = facts.rdma_devices()
    return {"devices": devices, "ports": facts.rdma_ports(devices)}


def _tensorflow():
    for dist in ("tensorflow", "tensorflow-cpu"):
        try:
            return {"version": importlib.metadata.version(dist), "wheel": dist}
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"version": None, "note": "TensorFlow is not installed; rdmadev depends on the "
                                     "TensorFlow its op library was built against: reinstall rdmadev"}


def _op_library():
    """Loads the op library as every task does (tf.load_op_library, after checking the
    TensorFlow version it was built against) and says whether that worked."""
    path = ops.library_path()
    try:
        from .._build_info import TF_VERSION as built_against
    except ImportError:
        built_against = None
    try:
        ops.load()
    except ConfigError as e:
        return {"loaded": False, "path": path, "built_against": built_against, "note": str(e)}
    except Exception as e:  # TF's own load errors (undefined symbols, wrong ABI): report them
        return {"loaded": False, "path": path, "built_against": built_against,
                "note": f"tf.load_op_library failed: {type(e).__name__}: {e}",
                "hint": "rebuild it: pip install --force-reinstall --no-deps -e ."}
    return {"loaded": True, "path": path, "built_against": built_against,
            "note": f"loads, built against TensorFlow {built_against} (the one installed)"}


def _tf_plugin(env=None):
    """Whether `import tensorflow` brought in the grpc+rdmadev protocol here (the loader in
    site-packages/tensorflow-plugins/, protocol.py), and if not, why."""
    env = os.environ if env is None else env
    path = protocol.plugin_path()
    if path is None:
        return {"active": False, "path": None,
                "note": "not installed for this interpreter: reinstall rdmadev (pip install -e .)"}
    if env.get(protocol.PLUGIN_SWITCH, "1") == "0":
        return {"active": False, "path": path, "note": f"switched off by {protocol.PLUGIN_SWITCH}=0"}
    import tensorflow  # loads the plugins

    with open("/proc/self/maps") as f:
        mapped = f.read()
    active = os.path.basename(protocol.library_path()) in mapped
    if active:
        note = f"{protocol.PROTOCOL} registered at import tensorflow"
    elif os.path.basename(path) in mapped:
        note = "installed but inactive: its warning at import tensorflow says why"
    else:
        # TF loads tensorflow-plugins/ only from the site-packages folders it finds, and
        # only when its own files are in one (tensorflow/__init__.py).
        tf_dir = os.path.dirname(tensorflow.__file__)
        why = (f"TensorFlow runs from {tf_dir}, outside a site-packages folder, and then loads "
               "no plugins" if "site-packages" not in tf_dir else
               f"TensorFlow ({tf_dir}) does not look in {os.path.dirname(path)}")
        note = (f"not loaded: {why}; a server your own script starts needs "
                "rdmadev.tf.protocol.load() first (rdmadev serve loads it)")
    return {"active": active, "path": path, "note": note}


def collect(env=None):
    """Everything doctor reports, as a dict (what --json prints)."""
    try:
        Config.from_env(env)
        config = "ok"
    except ConfigError as e:
        config = str(e)
    return {
        "config": config,
        "fabrics": [{"fabric": n, "viable": ok, "reason": why} for n, ok, why in fabric_report()],
        "memlock": _memlock(),
        "open_files": _open_files(),
        "dev_shm": _dev_shm(),
        "verbs": _verbs(),
        "tensorflow": _tensorflow(),
        "op_library": _op_library(),
        "tf_plugin": _tf_plugin(env),
        "recent_events": _core.recent_events(),
    }


def main(argv=None):
    """Prints the report; exit status 0 if at least one fabric is viable, the
    configuration is valid and the op library loads, else 1. With --peer, doctor_peer's
    report instead: 0 when no check found a problem, else 1."""
    import argparse

    from . import doctor_peer

    ap = argparse.ArgumentParser(prog="rdmadev doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--peer", metavar="HOST:PORT",
                    help="instead, check the path from this host to the task at HOST:PORT, its "
                         "TF address as in the cluster spec (the doctor asks its control "
                         "service, at PORT + RDMADEV_CONTROL_PORT_OFFSET, with this "
                         "RDMADEV_SECRET): reachable, secret, version, the fabric the pair "
                         "would use and that it connects, and on verbs link layer, GID type, "
                         "MTU and memlock; exit status 1 when a check finds a problem")
    ap.add_argument("--timeout", type=float, default=doctor_peer.DEFAULT_TIMEOUT_S, metavar="S",
                    help="with --peer: seconds each step may take (lookup, connect, each "
                         "answer; default %(default)g)")
    args = ap.parse_args(argv)
    if args.peer is not None:
        return doctor_peer.main(args.peer, args.timeout, args.json)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the op library check imports TF
    try:
        import_tensorflow()  # without TF's start-up lines; a failure is reported below
    except Exception:
        pass
    info = collect()
    healthy = (info["config"] == "ok" and any(f["viable"] for f in info["fabrics"])
               and info["op_library"]["loaded"])
    if args.json:
        print(json.dumps(info, indent=2))
        return 0 if healthy else 1
    print("rdmadev doctor")
    print(f"  configuration : {info['config']}")
    for f in info["fabrics"]:
        state = "viable" if f["viable"] else f"not viable: {f['reason']}"
        print(f"  fabric {f['fabric']:<6} : {state}")
    m = info["memlock"]
    print(f"  memlock limit : soft {m['soft']}, hard {m['hard']}" + (f"  ({m['note']})" if m["note"] else ""))
    n = info["open_files"]
    print(f"  open files    : soft {n['soft']}, hard {n['hard']}  ({n['note']})")
    s = info["dev_shm"]
    print(f"  /dev/shm      : {s.get('size')} ({s['note']})")
    v = info["verbs"]
    print(f"  rdma devices  : {', '.join(v['devices']) or 'none'} ({facts.SYSFS_IB})")
    for p in v["ports"]:
        print(f"  rdma port     : {p['device']} port {p['port']}: {p['state']}, {p['link_layer']}")
        for g in p["gids"]:
            print(f"    GID {g['index']:<3} {g['gid']}  ({g['kind']}{', ' + g['netdev'] if g['netdev'] else ''})")
    t = info["tensorflow"]
    print(f"  tensorflow    : {t.get('version') or t.get('note')}")
    o = info["op_library"]
    print(f"  op library    : {'' if o['loaded'] else 'NOT LOADED: '}{o['note']} ({o['path']})")
    p = info["tf_plugin"]
    print(f"  tf plugin     : {p['note']}" + (f" ({p['path']})" if p["path"] else ""))
    print("  healthy" if healthy else "  NOT healthy: see above")
    return 0 if healthy else 1
