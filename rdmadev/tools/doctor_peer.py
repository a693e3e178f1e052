"""`rdmadev doctor --peer HOST:PORT`: whether this host and the task whose TF address is
HOST:PORT (as in the cluster spec) can exchange tensors, each problem with its fix.

The doctor talks to the task's rdmadev control service, at PORT + RDMADEV_CONTROL_PORT_OFFSET
(minus it past 65535), with this shell's RDMADEV_SECRET, asks it for its `facts` (what
rdmadev.cluster.facts gathers in the task) and judges the pair with the same facts gathered here:

    resolved   HOST has an address here
    reachable  the control service accepts a connection (refused, timed out, no route: which)
    secret     it accepts this RDMADEV_SECRET (a wrong one is named, apart from unreachable)
    version    the same rdmadev, built against the same TensorFlow, on both ends
    rewrites   which functions the task's partition pass rewrites (a warning when only
               rdmadev.optimize's: a plain-TF coordinator's steps then stay on gRPC)
    fabric     the fabrics each end opened, and the one the pair would use: Domain.choose,
               the call the runtime's channels connect with (shm only under one kernel and
               pid namespace, never between two hosts)
    connects   an endpoint on that fabric opens (the fabric's own port and handshake)
    verbs      when both ends opened verbs: link layer and GID type agree, active MTUs
    memlock    when both ends opened verbs: each side's locked-memory limit holds what a
               task there may register (RDMADEV_MAX_REGISTERED_BYTES) and a peer's
               staging buffer

A check that cannot run because an earlier one failed is skipped. The comparisons are plain
functions of the two sides' facts (check_version, check_rewrites, check_verbs, check_memlock).

Example:
    $ RDMADEV_SECRET=... rdmadev doctor --peer 10.0.0.2:2222
    $ rdmadev doctor --peer 10.0.0.2:2222 --json
"""
import dataclasses
import errno
import json
import socket
import threading

from ..cluster.control import ControlClient, control_address
from ..cluster.facts import facts, reach, versions
from ..cluster.spec import split_address
from ..config import RAISE_MEMLOCK, VERBS_STAGING_BYTES, Config, memlock_holds, size_text
from ..device import open_domain
from ..errors import (AuthError, ConfigError, DeadlineExceeded, PeerLostError, ProtocolError,
                      RdmadevError)
from ..tf import pass_mode

__all__ = ["Check", "check_version", "check_rewrites", "check_verbs", "check_memlock", "diagnose",
           "main"]

#: Seconds the doctor waits by default for each step (name lookup, connect, each answer).
DEFAULT_TIMEOUT_S = 10.0
#: What the fix of a control service nobody answers on says.
SERVE_FIX = ("start the task with `rdmadev serve` (or a grpc+rdmadev server); its control "
             "service listens on the host of its cluster-spec address at its TF port + "
             "RDMADEV_CONTROL_PORT_OFFSET, so pass the task's TF port here and set the same "
             "offset in every task and here")


@dataclasses.dataclass
class Check:
    """One line of the report: `status` is "ok", "problem", "warning" (works, not at its
    best) or "skipped" (an earlier check failed, or it does not apply)."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _ok(name, detail):
    return Check(name, "ok", detail)


def _problem(name, detail, fix):
    return Check(name, "problem", detail, fix)


def _warning(name, detail, fix):
    return Check(name, "warning", detail, fix)


def _skipped(name, detail):
    return Check(name, "skipped", detail)


# --- judging: plain functions of the two sides' facts ---

def check_rewrites(theirs):
    """Which functions the peer's partition pass rewrites (rdmadev/tf/pass_mode.py): a task
    that rewrites only rdmadev.optimize's leaves a plain-TF coordinator's steps on gRPC."""
    mode = theirs.get("pass_mode")
    if mode == pass_mode.MODE_ALL:
        return _ok("rewrites", "every function the task partitions (RDMADEV_AUTO=1, or the "
                               "grpc+rdmadev protocol)")
    if mode == pass_mode.MODE_MARKED:
        return _warning("rewrites", "only the functions rdmadev.optimize marks (`rdmadev serve`'s "
                                    "default): the steps of a coordinator that does not wrap "
                                    "them stay on gRPC",
                        "start the task with RDMADEV_AUTO=1 for unchanged scripts, or wrap the "
                        "steps in rdmadev.optimize")
    if mode == pass_mode.MODE_OFF:
        return _warning("rewrites", "nothing: RDMADEV_ENABLED=0 in the task",
                        "unset RDMADEV_ENABLED in the task for rdmadev to carry its tensors")
    return _skipped("rewrites", "the peer has no partition pass loaded (it runs no TensorFlow "
                                "server, or predates this check)")


def check_version(mine, theirs):
    """Same rdmadev and same TensorFlow build on both ends."""
    here = f"rdmadev {mine['rdmadev']} built against TensorFlow {mine['tensorflow']}"
    there = f"rdmadev {theirs['rdmadev']} built against TensorFlow {theirs['tensorflow']}"
    if here == there:
        return _ok("version", f"{here} on both ends")
    return _problem("version", f"this host runs {here}, the peer {there}",
                    "install the same rdmadev (and TensorFlow) in every task and the coordinator")


def _size(n):
    return "unlimited" if n is None else size_text(n)


def check_memlock(side, who):
    """Whether `side`'s locked-memory limit holds what a task there pins on verbs: every
    region it registers (RDMADEV_MAX_REGISTERED_BYTES at most) and, outside that budget, a
    staging buffer per peer it writes to, of which the pair needs one (config.memlock_holds).
    A task raises its soft limit to the hard one when it starts, so the hard limit counts;
    CAP_IPC_LOCK exempts. The default budget leaves room for staging by construction
    (config.default_max_registered_bytes), so with it this fails only where the limit is too
    small to pin one staging buffer at all; a budget set above the limit fails it too."""
    m, budget = side["memlock"], side["max_registered_bytes"]
    if m["ipc_lock"]:
        return _ok("memlock", f"{who}: CAP_IPC_LOCK, no locked-memory limit applies")
    if m["hard"] is None:
        return _ok("memlock", f"{who}: no locked-memory limit")
    staging = VERBS_STAGING_BYTES
    if memlock_holds(budget, m["hard"]):
        peers = (m["hard"] - budget) // staging
        return _ok("memlock", f"{who}: hard limit {_size(m['hard'])} holds the {_size(budget)} "
                              f"a task may register and the {_size(staging)} staging buffers of "
                              f"{peers} verbs peer{'s' if peers > 1 else ''}")
    smaller = (f", or set RDMADEV_MAX_REGISTERED_BYTES to at most "
               f"{m['hard'] - staging} there (or unset it for the default)"
               if m["hard"] > staging else "")
    return _problem(
        "memlock", f"{who}: locked-memory hard limit {_size(m['hard'])} is below the "
                   f"{_size(budget)} a task may register (RDMADEV_MAX_REGISTERED_BYTES) and a "
                   f"verbs peer's {_size(staging)} staging buffer: registrations past the limit "
                   "fail on verbs",
        RAISE_MEMLOCK + smaller)


def check_verbs(mine, theirs):
    """[Check]: link layer and GID type must agree (InfiniBand does not reach RoCE; RoCE v1
    and v2 packets differ); differing active MTUs work at the smaller one (the QPs take the
    minimum), a warning. `mine`/`theirs` are the sides' facts()["verbs"]."""
    if not mine.get("device") or not theirs.get("device"):
        return [_skipped("verbs", "the verbs port in use was not found in sysfs on "
                                  f"{'this host' if not mine.get('device') else 'the peer'}")]
    ports = (f"here {mine['device']} port {mine['port']} GID {mine['gid_index']}, the peer "
             f"{theirs['device']} port {theirs['port']} GID {theirs['gid_index']}")
    out = []
    if mine["link_layer"] != theirs["link_layer"]:
        out.append(_problem("verbs", f"link layers differ: {mine['link_layer']} here, "
                                     f"{theirs['link_layer']} at the peer ({ports})",
                            "InfiniBand and Ethernet (RoCE) ports cannot reach each other: set "
                            "RDMADEV_DEVICE to ports of one link layer on both, or "
                            "RDMADEV_FABRIC=tcp"))
    elif mine["gid_type"] != theirs["gid_type"]:
        out.append(_problem("verbs", f"GID types differ: {mine['gid_type']} here, "
                                     f"{theirs['gid_type']} at the peer ({ports})",
                            "RoCE v1 and RoCE v2 do not interoperate: set RDMADEV_GID_INDEX on "
                            "one side to a GID of the other's type (`rdmadev doctor` lists "
                            "them; prefer RoCE v2 holding an IPv4 address)"))
    else:
        out.append(_ok("verbs", f"{mine['link_layer']}, {mine['gid_type']} on both ({ports})"))
    key = "active_mtu" if mine.get("active_mtu") and theirs.get("active_mtu") else "netdev_mtu"
    what = "active MTU" if key == "active_mtu" else "netdev MTU"
    a, b = mine.get(key), theirs.get(key)
    if not a or not b:
        out.append(_skipped("mtu", "unknown on "
                                   f"{'this host' if not a else 'the peer'} (no netdev, no pyverbs)"))
    elif a == b:
        out.append(_ok("mtu", f"{what} {a} on both"))
    else:
        out.append(_warning("mtu", f"{what} {a} here, {b} at the peer: the pair's QPs use "
                                   "the smaller",
                            "set the same MTU on both netdevs (ip link set DEV mtu N) for "
                            "full-size packets"))
    return out


def _fabrics_line(side):
    return ", ".join(item.split("=", 1)[0] for item in side["address"].split(";") if item)


def _why_not(fabric, mine, theirs):
    """Why the pair does not use `fabric` (one ranked above the one it uses)."""
    for who, side in (("here", mine), ("at the peer", theirs)):
        if reach(side["address"], fabric) is None:
            report = {f["fabric"]: f for f in side["fabrics"]}.get(fabric)
            if report is None:
                return f"{fabric} not in rdmadev {who}"
            return (f"{fabric} not viable {who}: {report['reason']}" if not report["viable"]
                    else f"{fabric} not opened {who} (RDMADEV_FABRIC={side['fabric_setting']})")
    if fabric == "shm":
        return ("shm not between these two: it needs one kernel and pid namespace, and the "
                "peer's boot id and pid namespace differ from this host's")
    return f"{fabric} cannot reach the peer's {reach(theirs['address'], fabric)}"


def _fabric_choice(domain, config, mine, theirs):
    """Check "fabric": the one Domain.choose picks (the runtime's connect picks by it)."""
    try:
        chosen = domain.choose(theirs["address"], config.fabric)
    except RdmadevError as e:
        return None, _problem("fabric", f"no fabric the pair can use: here {_fabrics_line(mine)}, "
                                        f"at the peer {_fabrics_line(theirs)}: {e.args[0]}",
                              "open a common fabric on both (RDMADEV_FABRIC=auto opens every "
                              "viable one; `rdmadev doctor` on each host says why one is not); "
                              "between hosts that is tcp or verbs")
    order = [f["fabric"] for f in mine["fabrics"]]
    better = [_why_not(f, mine, theirs) for f in order[:order.index(chosen)]]
    return chosen, _ok("fabric", f"the pair would use {chosen} (here {_fabrics_line(mine)}; "
                                 f"at the peer {_fabrics_line(theirs)})"
                       + "".join(f"; {w}" for w in better))


def _connects(domain, config, theirs, chosen, timeout):
    """Check "connects": an endpoint to the peer on the chosen fabric opens and is closed."""
    where = reach(theirs["address"], chosen)
    try:
        domain.connect(theirs["address"], config.fabric, timeout=timeout).close()
    except RdmadevError as e:
        fix = e.hint if chosen == "shm" else (
            "let the pair's fabric ports through between the hosts: a task's tcp fabric (and "
            "verbs' connection side channel) listens on its cluster-spec host at a port it "
            "picks at start, from the kernel's ip_local_port_range, so a firewall must pass "
            "that range between the job's hosts, not only the TF and control ports"
            + (f"; {e.hint}" if e.hint else ""))
        return _problem("connects", f"{chosen} to the peer's {where} failed: {e.args[0]}", fix)
    return _ok("connects", f"a {chosen} endpoint to the peer ({where}) opened")


# --- talking to the peer ---

def _resolve(host, port, timeout):
    """(address, port) of `host` or a Check of why not; bounded by `timeout` (a resolver
    whose server does not answer would retry for longer)."""
    out = {}

    def lookup():
        try:
            out["info"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            out["error"] = e.strerror

    t = threading.Thread(target=lookup, name="rdmadev-doctor-resolve", daemon=True)
    t.start()
    t.join(timeout)
    fix = (f"give the peer by an address or a name this host resolves (the one the cluster "
           f"spec lists), or add {host} to DNS or /etc/hosts")
    if "info" not in out:
        why = out.get("error", f"no answer within {timeout:g} s")
        return None, _problem("resolved", f"DNS: cannot resolve {host!r}: {why}", fix)
    addr = out["info"][0][4][:2]
    return addr, _ok("resolved", f"{host} is {addr[0]}" if addr[0] != host else
                     f"{host} (an address)")


def _unreachable(where, error, timeout):
    """Check "reachable" for a connect that failed with `error` (an OSError)."""
    if isinstance(error, TimeoutError) or error.errno == errno.ETIMEDOUT:
        return _problem("reachable", f"{where}: timed out after {timeout:g} s: nothing answered "
                                     "(a firewall drops the packets, or the host is down)",
                        "let the control port through the firewall between the hosts (TF port "
                        "+ RDMADEV_CONTROL_PORT_OFFSET), and check the host is up")
    known = {errno.ECONNREFUSED: ("connection refused: no process listens there", SERVE_FIX),
             errno.ENETUNREACH: ("no route: the network is unreachable from here",
                                 "route this host to the peer's network (ip route), or use the "
                                 "peer's address on a network both are on"),
             errno.EHOSTUNREACH: ("no route: the host is unreachable from here",
                                  "check that the peer's host and link are up; use an address "
                                  "of it on a network both are on")}
    kind, fix = known.get(error.errno, (error.strerror or str(error), SERVE_FIX))
    return _problem("reachable", f"{where}: {kind}", fix)


def _connect(addr, config, timeout):
    """(ControlClient, [Check]): the control connection and the reachable/secret checks."""
    where = f"{addr[0]}:{addr[1]}"
    try:
        client = ControlClient(addr, config.secret, timeout=timeout, name="doctor")
    except PeerLostError as e:
        if isinstance(e.__context__, OSError):  # the connect failed (ControlClient wraps it)
            return None, [_unreachable(where, e.__context__, timeout),
                          _skipped("secret", "not reachable")]
        return None, [_ok("reachable", f"{where} accepts connections"),
                      _problem("secret", f"what listens at {where} closed the connection "
                                         f"during rdmadev's handshake: {e.args[0]}",
                               "pass the task's TF port (the doctor adds "
                               "RDMADEV_CONTROL_PORT_OFFSET), and use the same "
                               "RDMADEV_CONTROL_PORT_OFFSET here as in the tasks")]
    except AuthError:
        return None, [_ok("reachable", f"{where} answers"),
                      _problem("secret", f"the control service at {where} rejected this "
                                         "RDMADEV_SECRET: the task's secret differs",
                               "set the same RDMADEV_SECRET (or RDMADEV_SECRET_FILE) here as in "
                               "the task, the coordinator and every other task")]
    except (ProtocolError, DeadlineExceeded, OSError) as e:
        return None, [_ok("reachable", f"{where} accepts connections"),
                      _problem("secret", f"what listens at {where} is not an rdmadev control "
                                         f"service (its handshake failed: {e.args[0]})",
                               "pass the task's TF port (the doctor adds "
                               "RDMADEV_CONTROL_PORT_OFFSET), and use the same "
                               "RDMADEV_CONTROL_PORT_OFFSET here as in the tasks")]
    return client, [_ok("reachable", f"{where} answers"),
                    _ok("secret", "the peer accepted this RDMADEV_SECRET and proved it knows it")]


def diagnose(peer, config, timeout=DEFAULT_TIMEOUT_S):
    """Runs every check against the task whose TF address is `peer`.

    Args:
        peer: "HOST:PORT", the task's address as in the cluster spec.
        config: this host's Config (secret, control-port offset, fabrics).
        timeout: seconds for each step (lookup, connect, each answer, the fabric connect).
    Returns:
        dict: "peer", "control" (host:port asked), "checks" ([Check] as dicts), "here" and
        "peer_facts" (facts() of both ends, None when unknown), "fabric" (the pair's, or
        None) and "healthy" (no check is a problem).
    Raises:
        ConfigError: `peer` is not host:port.
    """
    control = control_address(peer, config.control_port_offset)
    report = {"peer": peer, "control": f"{control[0]}:{control[1]}", "checks": [],
              "here": None, "peer_facts": None, "fabric": None}
    checks = report["checks"]
    theirs = None
    if not config.secret:
        checks.append(_problem("secret", "RDMADEV_SECRET is not set here, so no task can "
                                         "authenticate this host",
                               "set the cluster's RDMADEV_SECRET (or RDMADEV_SECRET_FILE)"))
    else:
        addr, check = _resolve(control[0], control[1], timeout)
        checks.append(check)
        client = None
        if addr is not None:
            client, found = _connect(addr, config, timeout)
            checks += found
        if client is not None:
            try:
                theirs = client.call({"op": "facts"})
            except RdmadevError as e:
                old = "unknown control request 'facts'" in str(e)
                checks.append(_problem(
                    "version", "the peer's rdmadev predates `doctor --peer` (it has no "
                               "'facts' request)" if old else f"the peer did not answer: {e}",
                    "install the same rdmadev in every task and here" if old
                    else "see the peer task's log"))
            finally:
                client.close()
    if theirs is None:
        return _finish(report)
    report["peer_facts"] = theirs
    checks.append(check_version(versions(), theirs))
    checks.append(check_rewrites(theirs))
    try:
        domain = open_domain("doctor", config)
    except RdmadevError as e:
        checks.append(_problem("fabric", f"this host opens no fabric: {e.args[0]}", e.hint))
        return _finish(report)
    with domain:
        mine = report["here"] = facts(config, domain)
        chosen, check = _fabric_choice(domain, config, mine, theirs)
        checks.append(check)
        report["fabric"] = chosen
        if chosen is not None:
            checks.append(_connects(domain, config, theirs, chosen, timeout))
        if mine["verbs"] is None or theirs["verbs"] is None:
            checks += [_skipped("verbs", "verbs is not open on both ends (the fabric line "
                                         "says why)"),
                       _skipped("memlock", "verbs only (it pins what it registers)")]
        else:
            checks += check_verbs(mine["verbs"], theirs["verbs"])
            checks += [check_memlock(mine, "this host"), check_memlock(theirs, "the peer")]
    return _finish(report)


def _finish(report):
    report["healthy"] = not any(c.status == "problem" for c in report["checks"])
    report["checks"] = [dataclasses.asdict(c) for c in report["checks"]]
    return report


def print_report(report):
    """The report as text: a line per check, its fix under a problem or warning."""
    print(f"rdmadev doctor --peer {report['peer']} (its control service: {report['control']})")
    width = max(len(c["name"]) for c in report["checks"])
    for c in report["checks"]:
        state = {"ok": "ok", "problem": "PROBLEM", "warning": "warning",
                 "skipped": "skipped"}[c["status"]]
        print(f"  {c['name']:<{width}} : {state}: {c['detail']}")
        if c["fix"]:
            print(f"  {'':<{width}}   fix: {c['fix']}")
    problems = sum(c["status"] == "problem" for c in report["checks"])
    print("  the pair is healthy" if not problems else
          f"  {problems} problem{'s' if problems > 1 else ''}: see above")


def main(peer, timeout=DEFAULT_TIMEOUT_S, as_json=False, env=None):
    """Diagnoses `peer` with this environment's configuration and prints the report.

    Returns:
        0 when no check found a problem, else 1.
    """
    try:
        try:
            split_address(peer)
        except ConfigError:
            raise ConfigError(f"--peer {peer!r} is not HOST:PORT",
                              hint="pass the task's address as the cluster spec lists it, e.g. "
                                   "10.0.0.2:2222") from None
        report = diagnose(peer, Config.from_env(env), timeout)
    except ConfigError as e:
        report = _finish({"peer": peer, "control": "?", "here": None, "peer_facts": None,
                          "fabric": None, "checks": [_problem("configuration", e.args[0], e.hint)]})
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0 if report["healthy"] else 1
