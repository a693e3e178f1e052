"""A task's threads do not grow with its peers, and its descriptors grow by 3 per peer (issue 60,
item 3): its event loop serves every control link and heartbeat (rdmadev/cluster/event_loop.py),
one link per peer (links.py) and one heartbeat socket for all of them (liveness.py). No TF.

ps:0 and PEERS workers are `tests/control_task.py` processes; this process plans, as a
coordinator, a pair of channels to and from the ps for one worker after another, so that the ps
and each worker call each other, ping each other and are pinged.
"""
import json
import os
import sys
import threading
import time

import pytest

from graph_pass.devices import task_name
from rdmadev import Config
from rdmadev.cluster import channels, event_loop, runtime
from rdmadev.testing import launch
from rdmadev.testing.timing import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import control_task  # noqa: E402
from test_channel_setup import exchange, plan  # noqa: E402

SECRET = "rdmadev-event-loop-secret"
PS = task_name("ps", 0)
#: Worker tasks beside the ps; the first one is the baseline.
PEERS = 8
#: RDMADEV_LIVENESS_S: pings every 0.125 s, so every peer answers within a second.
LIVENESS_S = 1.0
#: Descriptors a peer with one pair each way costs the ps on shm, read from /proc/PID/fd: the
#: control link between the two (whichever dialed it), the peer's pidfd, and the memfd of the
#: chunk holding the ring the ps receives into and the credit region it sends through. It was
#: 7 on 2026-12-04 (four control sockets: calls and a heartbeat lane each way, and a memfd per
#: region) and 9 with two lanes each way.
FDS_PER_PEER = 3


def test_workers_start_on_demand_end_when_idle_and_never_deadlock(monkeypatch):
    """A call starts a thread only when none is idle; a thread ends IDLE_S after its last
    work; work that waits for other work on the same workers (a request whose handler calls
    another task, served by the same pool) finishes."""
    monkeypatch.setattr(event_loop, "IDLE_S", 0.3)
    workers = event_loop.Workers("test")
    try:
        assert [workers.submit(lambda i=i: i * 2).result(5) for i in range(20)] == \
            list(range(0, 40, 2))
        assert workers.threads() == 1, "one at a time: the idle thread takes the next"
        gate = threading.Event()
        waiting = [workers.submit(gate.wait, 10) for _ in range(4)]
        assert workers.submit(lambda: workers.submit(gate.set).result(5)).result(5) is None
        assert all(f.result(5) for f in waiting)
        assert workers.threads() >= 5, "each waiting call had a thread of its own"
        assert wait_until(lambda: workers.threads() == 0, 10, 0.05), workers.threads()
        assert not [t for t in threading.enumerate() if t.name == "rdmadev-work test"]
    finally:
        workers.shutdown()


@pytest.fixture
def cluster():
    ports = launch.free_ports(1 + PEERS)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}

    def launcher(job, index, _):
        return [sys.executable, os.path.join(HERE, "control_task.py"), "--cluster",
                json.dumps(spec), "--job", job, "--task", str(index)]

    env = {"RDMADEV_SECRET": SECRET, "RDMADEV_DEADLINE_S": "60", "RDMADEV_FABRIC": "shm",
           "RDMADEV_LIVENESS_S": str(LIVENESS_S),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE,
                                          os.environ.get("PYTHONPATH", "")])}
    with launch.Cluster(spec=spec, env=env, launcher=launcher) as launched:
        rt = runtime.Runtime(spec, config=Config(fabric="shm", secret=SECRET.encode(),
                                                 deadline_s=60, liveness_s=LIVENESS_S))
        try:
            yield rt, launched
        finally:
            rt.close()


def test_a_tasks_threads_stay_flat_as_peers_join(cluster):
    rt, launched = cluster
    joined = []

    def join(n):
        """The ps's counters once n workers have channels with it and answer its heartbeats."""
        while len(joined) < n:
            worker = task_name("worker", len(joined))
            joined.append(worker)
            _, swap, regions = plan([(PS, worker), (worker, PS)])
            channels.open_channels(rt.call, f"peer-{len(joined)}", swap, regions)
            assert all(exchange(rt, t, count=3, seed=len(joined)) == [] for t in swap)

        def up():
            c = rt.call(PS, {"op": "counters"})
            heard = c["heard_by_datagram"]
            return c if len(c["peers"]) == n and heard == n else None
        c = rt.call(PS, {"op": "counters"})
        assert wait_until(up, 30, 0.1), (c["peers"], c["control_connections"],
                                         open(launched.log_path("ps", 0)).read()[-3000:])
        time.sleep(2 * LIVENESS_S)  # every peer has pinged and been pinged a few times
        return up()

    one = join(1)
    many = join(PEERS)
    assert many["py_threads"] == one["py_threads"], (one["thread_names"], many["thread_names"])
    assert many["control_connections"]["links"] == PEERS, many["control_connections"]
    per_peer = (many["fds"] - one["fds"]) / (PEERS - 1)
    assert per_peer <= FDS_PER_PEER, (one["fds"], many["fds"], many["control_connections"])
    assert many["silent_peers"] == [], many["silent_peers"]
