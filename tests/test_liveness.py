"""Heartbeats (rdmadev/cluster/liveness.py) between real task processes, no TF: a stopped
peer is reported silent within RDMADEV_LIVENESS_S, while a wait on it goes on as TF's own
waits do and finishes once it runs again; a wait that times out meanwhile says it is silent.

ps:0 is a `tests/control_task.py` process; this test process is worker:1 (it plans).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import rdmadev
from graph_pass.devices import task_name
from rdmadev import Config, _core
from rdmadev.cluster import channels, liveness, runtime
from rdmadev.errors import DeadlineExceeded
from rdmadev.testing import launch
from rdmadev.testing.timing import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import control_task  # noqa: E402
import netns  # noqa: E402
from test_channel_setup import exchange, plan  # noqa: E402

FABRICS = [f for f in rdmadev.viable_fabrics() if f != "verbs"]

SECRET = "rdmadev-liveness-secret"
PS, W1 = task_name("ps", 0), task_name("worker", 1)
#: RDMADEV_LIVENESS_S in both tasks: short, so a test takes seconds.
LIVENESS_S = 1.0
#: RDMADEV_DEADLINE_S: what a silent peer would cost without heartbeats.
DEADLINE_S = 120.0
#: The bound the module promises (liveness + two ping intervals), plus scheduling slack for a
#: loaded 2-core machine; far below DEADLINE_S either way.
DETECTED_WITHIN_S = LIVENESS_S * (1 + 2 / liveness.PINGS_PER_LIVENESS) + 10.0


@pytest.fixture(params=FABRICS)
def pair(request):
    """(this process's Runtime as worker:1, the cluster holding ps:0), on one fabric."""
    ports = launch.free_ports(3)  # worker:0 is never started
    spec = {"ps": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    full = json.dumps(spec)

    def launcher(job, index, _):
        return [sys.executable, os.path.join(HERE, "control_task.py"), "--cluster", full,
                "--job", job, "--task", str(index)]

    env = {"RDMADEV_SECRET": SECRET, "RDMADEV_DEADLINE_S": str(DEADLINE_S),
           "RDMADEV_LIVENESS_S": str(LIVENESS_S), "RDMADEV_FABRIC": request.param,
           "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")])}
    runtime.register_handler("t_send", control_task.t_send)
    runtime.register_handler("t_recv", control_task.t_recv)
    with launch.Cluster(spec={"ps": spec["ps"]}, env=env, launcher=launcher) as cluster:
        rt = runtime.Runtime(spec, "worker", 1, Config(fabric=request.param, secret=SECRET.encode(),
                                                        deadline_s=DEADLINE_S, liveness_s=LIVENESS_S))
        try:
            yield rt, cluster
        finally:
            os.kill(cluster.pid("ps", 0), signal.SIGCONT)  # never leave it stopped
            rt.close()


def test_a_stopped_peer_is_reported_silent_and_a_wait_on_it_finishes_once_it_runs_again(pair):
    """As on TF's gRPC path, where nothing fails while a task is stopped: failing the wait
    would fail a step TF finishes (and under ParameterServerStrategy turn a stalled worker
    into a lost ps: tests/chaos, the PSS job)."""
    rt, cluster = pair
    _, swap, regions = plan([(PS, W1), (W1, PS)])
    channels.open_channels(rt.call, "live", swap, regions)
    into_me = next(t for t in swap if t.recv_task == W1)
    assert exchange(rt, into_me, 5, seed=1) == []  # works, and the heartbeats are running
    assert rt.table.counters()["silent_peers"] == []

    os.kill(cluster.pid("ps", 0), signal.SIGSTOP)
    stopped = time.monotonic()
    assert wait_until(lambda: rt.table.counters()["silent_peers"] == [PS], DETECTED_WITHIN_S)
    assert time.monotonic() - stopped >= LIVENESS_S
    # a wait that times out says why the peer never wrote
    with pytest.raises(DeadlineExceeded, match=r"transfer 6 .*silent: no answer to rdmadev "
                                               r"heartbeats since .* UTC .*RDMADEV_LIVENESS_S=1"):
        _core.channel_recv(into_me.channel_key, timeout=0.5)
    got = {}

    def wait():
        try:
            got["data"] = _core.channel_recv(into_me.channel_key, timeout=DEADLINE_S)[1]
        except Exception as e:  # reported below
            got["error"] = e
    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(2 * LIVENESS_S)  # well past the mark, the wait goes on
    assert waiter.is_alive() and not got, got
    assert rt.table.counters()["channels"] == 3 + 3  # silent is not gone: nothing was unbound

    os.kill(cluster.pid("ps", 0), signal.SIGCONT)
    size = into_me.capacity_bytes
    rt.call(PS, {"op": "t_send", "key": into_me.channel_key, "count": 1, "size": size, "seed": 3})
    waiter.join(DEADLINE_S)
    assert got.get("data") == control_task.pattern(size, 3), got.get("error")
    assert wait_until(lambda: rt.table.counters()["silent_peers"] == [], DETECTED_WITHIN_S)
    for t in swap:  # both directions carry correct data again, credits included
        assert exchange(rt, t, 5, seed=7) == []


def test_a_peer_that_answers_stays_heard_through_a_long_wait(pair):
    """A wait on a running peer that simply sends late is not ended by the heartbeats."""
    rt, _ = pair
    _, swap, regions = plan([(PS, W1)])
    channels.open_channels(rt.call, "late", swap, regions)
    t = swap[0]
    size = t.capacity_bytes
    late = threading.Timer(4 * LIVENESS_S, lambda: rt.call(PS, {
        "op": "t_send", "key": t.channel_key, "count": 1, "size": size, "seed": 3}))
    late.start()
    try:
        seq, data = _core.channel_recv(t.channel_key, timeout=DEADLINE_S)
    finally:
        late.join(DEADLINE_S)
    assert data == control_task.pattern(size, 3)
    assert rt.table.counters()["silent_peers"] == []


def _dropping(rules, seconds, rt, heard=None):
    """The silent peers seen while nftables drops loopback packets matching each of `rules`
    (e.g. "tcp sport 1234") for `seconds`, and how many packets it dropped; with a list
    `heard`, appends rt's heard_by_datagram() read before the drop ends (after it, a datagram
    may come through at once)."""
    table = f"rdmadev_test_drop_{os.getpid()}"
    script = [f"add table inet {table}",
              f"add chain inet {table} out {{ type filter hook output priority 0; }}"]
    script += [f"add rule inet {table} out oifname lo {r} counter drop" for r in rules]
    subprocess.run(["nft", "-f", "-"], text=True, check=True, capture_output=True, timeout=30,
                   input="\n".join(script) + "\n")
    try:
        silent, until = [], time.monotonic() + seconds
        while time.monotonic() < until:
            silent += rt.table.counters()["silent_peers"]
            time.sleep(0.02)
        if heard is not None:
            heard.append(rt.heartbeats.heard_by_datagram())
        listed = subprocess.run(["nft", "list", "table", "inet", table], capture_output=True,
                                text=True, timeout=30).stdout
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=30)
    return silent, sum(map(int, re.findall(r"packets (\d+)", listed)))


@pytest.mark.parametrize("pair", ["tcp"], indirect=True)
def test_a_peer_stays_heard_by_datagram_while_its_control_link_is_stalled(pair):
    """A ping on a TCP connection whose packets are lost waits for retransmissions and holds
    the next pings behind it; datagrams do not. Real loss: nftables drops every packet of the
    control link between the two tasks (its port only) for 4 x RDMADEV_LIVENESS_S."""
    netns.require("nft")
    rt, _ = pair
    _, swap, regions = plan([(PS, W1)])
    channels.open_channels(rt.call, "stalled", swap, regions)  # an endpoint: the ps is watched
    assert wait_until(lambda: rt.heartbeats.heard_by_datagram() == 1, 30)
    (link,) = rt.links.live[PS]
    port = link.sock.getsockname()[1]
    stalled = threading.Timer(0.5, rt.call, (PS, {"op": "ping"}))  # waits for retransmissions
    stalled.start()
    silent, dropped = _dropping([f"tcp sport {port}", f"tcp dport {port}"], 4 * LIVENESS_S, rt)
    stalled.join(DEADLINE_S)
    assert dropped > 0  # lost, really
    assert silent == []  # yet the ps was never marked silent: its datagram answers came
    assert rt.heartbeats.heard_by_datagram() == 1
    assert rt.links.live[PS] == [link]  # and the stalled link carries calls again


@pytest.mark.parametrize("pair", ["tcp"], indirect=True)
def test_a_peer_whose_datagrams_are_filtered_is_pinged_on_its_link(pair):
    """UDP filtered between two hosts (a firewall that lets the control port's TCP through):
    the peer is pinged on its control link instead and never marked silent. Real filtering:
    nftables drops every heartbeat datagram on loopback for 4 x RDMADEV_LIVENESS_S."""
    netns.require("nft")
    rt, _ = pair
    _, swap, regions = plan([(PS, W1)])
    channels.open_channels(rt.call, "filtered", swap, regions)
    assert wait_until(lambda: rt.heartbeats.heard_by_datagram() == 1, 30)
    ports = " , ".join(str(p) for p in {rt.server.server_address[1],
                                       rt._control_address(PS)[1]})
    heard = []
    silent, dropped = _dropping([f"udp dport {{ {ports} }}"], 4 * LIVENESS_S, rt, heard)
    assert dropped > 0
    assert heard == [0]  # none came through: heard on the link
    assert silent == []
    assert wait_until(lambda: rt.heartbeats.heard_by_datagram() == 1, 30)  # and back


def test_a_heartbeat_datagram_counts_only_as_an_answer_to_a_recent_ping_of_ours():
    """Only a datagram under the cluster secret's HMAC, addressed to this task and answering
    one of its own recent nonces hears a peer: a forged, misaddressed or replayed one does
    not, and a ping is answered to whoever sent it, at its size (no amplification)."""
    beats = []
    try:
        for task, secret in ((PS, b"s"), (W1, b"s"), ("/job:worker/replica:0/task:0", b"other")):
            listener = socket.create_server(("127.0.0.1", 0))
            beats.append(liveness.Heartbeats(1000.0, dict, task, secret, listener,
                                             None, None))
            listener.close()
        ps, worker, stranger = beats
        peer = liveness._Peer(W1, worker.sock.getsockname())
        ps.peers[W1] = peer
        nonce = b"n" * liveness.NONCE_BYTES
        peer.nonces.append(nonce)
        answered_before = peer.answered

        def arrives(datagram, to=ps):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sender.sendto(datagram, to.sock.getsockname())
            sender.close()
            time.sleep(0.2)

        refused = ps.refused
        arrives(stranger._datagram(liveness.ANSWER, nonce, PS.encode()))  # another secret
        arrives(worker._datagram(liveness.ANSWER, nonce, b"/job:ps/replica:0/task:9"))  # not us
        arrives(worker._datagram(liveness.ANSWER, nonce, PS.encode())[:-1] + b"x")  # tampered
        assert ps.refused == refused + 3 and peer.answered is answered_before
        arrives(worker._datagram(liveness.ANSWER, b"m" * liveness.NONCE_BYTES, PS.encode()))
        assert peer.answered is answered_before  # not a nonce of ours
        arrives(worker._datagram(liveness.ANSWER, nonce, PS.encode()))
        assert peer.answered is not answered_before  # an answer to our ping: heard
        heard = peer.answered
        arrives(worker._datagram(liveness.ANSWER, nonce, PS.encode()))
        assert peer.answered == heard  # replayed: the nonce was used up

        asker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        asker.bind(("127.0.0.1", 0))
        asker.settimeout(5)
        ping = worker._datagram(liveness.PING, nonce, PS.encode())
        asker.sendto(ping, ps.sock.getsockname())
        answer, _ = asker.recvfrom(liveness.MAX_DATAGRAM)
        asker.close()
        assert len(answer) == len(ping) and ps._parse(answer) is None  # addressed to W1
        assert worker._parse(answer) == (liveness.ANSWER, nonce, PS.encode())
    finally:
        for b in beats:
            b.close()


def test_liveness_zero_turns_heartbeats_off():
    rt = runtime.Runtime({"worker": [f"127.0.0.1:{launch.free_ports(1)[0]}"]}, "worker", 0,
                         Config(secret=SECRET.encode(), liveness_s=0.0))
    try:
        assert rt.heartbeats is None
        assert not [t for t in threading.enumerate() if t.name.startswith("rdmadev-liveness")]
    finally:
        rt.close()


def test_liveness_setting_is_validated():
    assert Config.from_env({"RDMADEV_LIVENESS_S": "2.5"}).liveness_s == 2.5
    with pytest.raises(rdmadev.ConfigError, match="RDMADEV_LIVENESS_S"):
        Config.from_env({"RDMADEV_LIVENESS_S": "-1"})
