"""Control links (rdmadev/cluster/links.py, control.Link): one connection per task pair, used
both ways, between real runtimes in this process (several tasks per process, as TF's
in-process clusters run them), on loopback. No TF."""
import socket
import threading
import time

import pytest

import rdmadev
from graph_pass.devices import task_name
from rdmadev.cluster import control, instances, links, runtime
from rdmadev.cluster.event_loop import EventLoop
from rdmadev.testing.launch import free_ports
from rdmadev.testing.timing import wait_until

PS, W0 = task_name("ps", 0), task_name("worker", 0)
SECRET = b"rdmadev-links-secret"


@pytest.fixture
def pair():
    """{task: Runtime} of ps:0 and worker:0, in this process."""
    ports = free_ports(2)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    config = rdmadev.Config(secret=SECRET, deadline_s=10, liveness_s=0)
    tasks = {}
    try:
        tasks[PS] = runtime.Runtime(spec, "ps", 0, config)
        tasks[W0] = runtime.Runtime(spec, "worker", 0, config)
        yield tasks
    finally:
        for rt in tasks.values():
            rt.close()


def _links(rt):
    """(links, of them dialed by the peer) of `rt`, and the connections its server serves."""
    return rt.links.count(), rt.server.connections


def test_two_tasks_that_dial_each_other_at_once_keep_one_link(pair, monkeypatch):
    """Channel setup calls both ways at once: both tasks dial, the one whose name sorts first
    (ps) keeps its own and refuses the other's offer, and both then call on ps's link. ps's
    dial is held back 0.5 s, so that the worker's offer surely comes while ps dials."""
    dial = links.dial

    def slow_from_ps(address, secret, name, *args, **kwargs):
        if name == PS:
            time.sleep(0.5)
        return dial(address, secret, name, *args, **kwargs)
    monkeypatch.setattr(links, "dial", slow_from_ps)
    go = threading.Barrier(2)
    got = {}

    def call(at, to):
        go.wait(10)
        got[at] = pair[at].call(to, {"op": "ping"})["task"]
    threads = [threading.Thread(target=call, args=(PS, W0)),
               threading.Thread(target=call, args=(W0, PS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {PS: W0, W0: PS}
    assert pair[PS].links.refused == 1  # the worker's offer
    # the refused connection closes on both ends
    assert wait_until(lambda: _links(pair[PS]) == ((1, 0), 0) and
                      _links(pair[W0]) == ((1, 1), 1), 10), (_links(pair[PS]), _links(pair[W0]))
    (mine,) = pair[PS].links.live[W0]
    for _ in range(3):  # and every later call, either way, goes on it
        assert pair[W0].call(PS, {"op": "ping"})["task"] == PS
        assert pair[PS].call(W0, {"op": "ping"})["task"] == W0
    assert pair[PS].links.live[W0] == [mine] and _links(pair[W0]) == ((1, 1), 1)


def test_a_call_whose_handler_calls_back_goes_on_the_same_link(pair):
    """ps asks worker, whose handler asks ps, whose handler asks worker again (what reopen does
    on both tasks after a break), all on the one link: each request under an id of its own, so
    none waits behind another."""
    def relay(request):  # served at request["at"]: asks the next task of the route, if any
        at, route = request["at"], request["route"]
        if not route:
            return [at]
        return [at] + pair[at].call(route[0], {"op": "t_relay", "at": route[0],
                                               "route": route[1:]})

    runtime.register_handler("t_relay", relay)
    route = [W0, PS, W0, PS, W0]
    assert pair[PS].call(W0, {"op": "t_relay", "at": W0, "route": route[1:]}) == route
    assert _links(pair[PS])[0][0] == 1 and _links(pair[W0])[0][0] == 1


def test_a_call_that_times_out_leaves_the_link_to_the_next_call(pair):
    """The late reply of a call that gave up is dropped, not read as the next call's; the
    request is not sent again (the peer may still be serving it)."""
    served = []

    def slow(request):
        served.append(request["n"])
        time.sleep(request["sleep_s"])
        return request["n"]

    runtime.register_handler("t_slow", slow)
    link, _ = pair[W0].links.get(PS)
    with pytest.raises(rdmadev.DeadlineExceeded, match="did not answer t_slow within 0.5 s"):
        link.call({"op": "t_slow", "n": 1, "sleep_s": 1.5}, 0.5)
    assert link.call({"op": "t_slow", "n": 2, "sleep_s": 0}, 10) == 2  # while 1 still runs
    time.sleep(1.5)  # 1's answer comes now, and is dropped
    assert link.call({"op": "t_slow", "n": 3, "sleep_s": 0}, 10) == 3
    assert served == [1, 2, 3] and not link.broken and pair[W0].links.live[PS] == [link]


def test_an_offer_from_a_new_incarnation_replaces_the_old_link(pair):
    """A task that restarted (its host crashed: the old connection may never see a FIN) offers
    a new link: the links to its earlier incarnation are closed, and with them goes what it
    planned there."""
    ps = pair[PS]
    loop = EventLoop("test-links")
    try:
        address = ps.server.server_address
        old, answer = control.dial(address, SECRET, W0, lambda r: {}, loop, 10,
                                   offer={"incarnation": "first"})
        assert answer["kept"] and ps.links.live[W0] != []
        again, answer = control.dial(address, SECRET, W0, lambda r: {}, loop, 10,
                                     offer={"incarnation": "first"})  # same one: kept beside
        assert answer["kept"] and len(ps.links.live[W0]) == 2
        new, answer = control.dial(address, SECRET, W0, lambda r: {}, loop, 10,
                                   offer={"incarnation": "second"})
        assert answer["kept"]
        old.ended.result(10)
        again.ended.result(10)  # both links to "first" ended
        assert "closed by the peer" in old.broken
        assert wait_until(lambda: len(ps.links.live.get(W0, ())) == 1, 10)
        assert not new.broken
        new.close()
    finally:
        loop.close()


def test_a_link_refuses_requests_past_its_limit_in_flight(pair, monkeypatch):
    """A peer that sends more requests at once than any task makes gets the rest refused, not
    queued, and the link goes on."""
    monkeypatch.setattr(control, "MAX_IN_FLIGHT", 2)
    gate = threading.Event()
    runtime.register_handler("t_wait", lambda r: gate.wait(10))
    link, _ = pair[W0].links.get(PS)
    results = []

    def call():
        try:
            results.append(link.call({"op": "t_wait"}, 10))
        except rdmadev.ProtocolError as e:
            results.append(str(e))
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(results) == 2, 10), results
    gate.set()
    for t in threads:
        t.join(10)
    refused = [r for r in results if isinstance(r, str)]
    assert len(refused) == 2 and all("2 requests in flight" in r for r in refused), results
    assert results.count(True) == 2
    assert link.call({"op": "ping"}, 10)["task"] == PS


def test_both_ends_of_a_link_send_at_once(pair):
    """Setup's pattern on a link the peer dialed: ps answers one of the worker's calls and, at
    the same moment, calls the worker from another (open_pair calling attach_senders). With
    Nagle's algorithm on ps's accepted socket, the second message waited for the worker's
    ACK of the first, which delayed ACKs hold up to 40 ms: such calls took ~45 ms instead of
    about 1 (a median of 43.6 ms over 20 on an idle machine, 2026-12-05). Timing it is no
    test on a loaded machine (a loaded round took 80-110 ms either way), so this checks the
    cause: both ends of the link have TCP_NODELAY (control._no_delay)."""
    link, _ = pair[W0].links.get(PS)  # the worker dials: ps's end is the accepted socket
    assert link.call({"op": "ping"}, 10)["task"] == PS
    assert pair[PS].links.count() == (1, 1)
    (accepted,) = pair[PS].links.live[W0]
    for end in (link, accepted):
        assert end.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), end.where


def test_a_task_that_restarts_is_told_the_standing_requests_again(pair):
    """The coordinator's own_function (instances.py) makes a task release a function's
    instantiations once the coordinator's link ends. A worker that restarted while the job ran
    never heard it, and what it planned for the function after the restart stayed after the
    coordinator exited (the chaos tier's kill -9 of a ParameterServerStrategy worker left 4
    channels on the ps). The request stands: once the worker is back it is sent again, and
    closing the coordinator's links releases what the new worker filed."""
    coordinator, worker = pair[PS], pair[W0]  # ps plays the coordinator: it dials the worker
    own = {"op": "own_function", "function": "step"}
    assert coordinator.call(W0, own) is True
    coordinator.links.stand(("function", "step"), own)
    spec, config = worker.cluster, worker.config
    worker.close()  # the worker dies; it comes back as a new incarnation on the same port
    pair[W0] = worker = runtime.Runtime(spec, "worker", 0, config)
    released = threading.Event()
    instances._tracker().file({"step"}, "after-the-restart", released.set)
    # the new worker holds `own` on the coordinator's new link once that dialed it again
    assert wait_until(lambda: worker.server.connections >= 1 and not coordinator.links.redialing,
                      10)
    coordinator.close()  # the coordinator exits without release_function
    assert released.wait(10), "the new worker kept what it planned for the function"
    pair.pop(PS)


def test_a_request_that_no_longer_stands_is_not_sent_again(pair):
    """Once the function was released (sit), a restarted task is not dialed for it."""
    coordinator, worker = pair[PS], pair[W0]
    coordinator.links.stand(("function", "step"), {"op": "own_function", "function": "step"})
    coordinator.links.sit(("function", "step"))
    assert coordinator.call(W0, {"op": "ping"})["task"] == W0
    spec, config = worker.cluster, worker.config
    worker.close()
    pair[W0] = worker = runtime.Runtime(spec, "worker", 0, config)
    time.sleep(3 * links.REDIAL_EVERY_S)
    assert worker.server.connections == 0 and not coordinator.links.redialing


def test_an_instantiation_filed_after_its_function_was_released_goes_at_once():
    """A worker may finish planning a closure of the job after its coordinator exited (the
    link's end released the function first): the late instantiation is released as soon as
    it is filed, not kept."""
    tracker = instances._tracker()
    name = f"late-{time.monotonic_ns()}"
    assert tracker.release_function(name) == 0  # the owner's link ended: nothing filed yet
    released = threading.Event()
    tracker.file({name}, "planned-late", released.set)
    assert released.wait(10) and name not in tracker.by_function
