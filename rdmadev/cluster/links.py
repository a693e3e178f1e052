"""A task's control links: one authenticated connection to each peer task, used both ways.

Task A calls task B on the link between them, whichever of the two dialed it: a link A dialed
serves B's requests too (A offers it with the ``link`` request it sends first), so a pair of
tasks holds one control connection, not one per direction (issue 60: a ps paid four per
worker, calls and heartbeat lanes both ways). Calls share it, each under an id of its own
(control.Link), so a request whose handler calls back into the caller never waits behind
another.

Two tasks often dial each other at the same moment: channel setup runs both ways at once. The
task whose name sorts first keeps its own: it refuses the other's offer while it dials that
task or holds a link it dialed to the same incarnation of it. The refused task closes its
connection (it carried only the offer) and takes the link it is offered instead, dialing again
when none comes within OFFER_WAIT_S. An offer from a new incarnation of a task (it restarted;
every Links names its own incarnation) replaces the links to the old one, which are closed:
what the old one planned here is released with them.

What a process told every task and a task keeps only while the link lasts (the coordinator's
``own_function``: instances.py) stands (``stand``): when a link ends while requests stand, the
task is dialed again until it is back, within the deadline, and its new incarnation is sent
them all. A restarted worker would otherwise plan for a function no link of its owner holds,
and keep those channels after the owner exited.

Example:
    >>> links = Links("/job:worker/replica:0/task:0", address_of, secret, handle, loop_of, 60.0)
    >>> links.call("/job:ps/replica:0/task:0", {"op": "ping"})
"""
import collections
import logging
import os
import threading
import time

from ..errors import ClosedError, DeadlineExceeded, PeerLostError, RdmadevError
from .control import dial

__all__ = ["Links", "OFFER_WAIT_S", "REDIAL_EVERY_S"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Seconds a task whose offer was refused waits for the peer's own link before it dials again.
OFFER_WAIT_S = 1.0
#: Seconds between dials of a task whose link ended while requests stand (until it is back).
REDIAL_EVERY_S = 0.1


class Links:
    """The live links of task `name` (the coordinator's too: it dials and serves nothing), by
    peer task.

    Args:
        name: this task's name, as it authenticates (or "coordinator").
        address_of: ``task -> (host, port)`` of that task's control service.
        secret: the cluster secret.
        handler: ``request -> result``, serving the peer's requests on links this task dialed.
        loop_of: ``() -> EventLoop`` that serves the links (called at the first dial).
        timeout: seconds a dial or a call may take (RDMADEV_DEADLINE_S).
        heard: ``task -> None``, told of every message a peer sends (heartbeats), or None.
    """

    def __init__(self, name, address_of, secret, handler, loop_of, timeout, heard=None):
        self.name = name
        self.incarnation = os.urandom(8).hex()
        self.address_of = address_of
        self.secret = secret
        self.handler = handler
        self.loop_of = loop_of
        self.timeout = timeout
        self.heard = heard
        self.changed = threading.Condition()  # guards the rest; notified when a link comes
        self.live = collections.defaultdict(list)  # task -> its links, oldest first
        self.dialing = set()  # tasks this one dials now
        self.refused = 0  # offers refused: this task's own link won
        self.dial_locks = collections.defaultdict(threading.Lock)  # task -> held while dialing
        self.standing = {}  # key -> request every task's incarnation is to hold (stand)
        self.redialing = set()  # tasks dialed again to be sent the standing requests
        self.closed = False

    def call(self, task, request):
        """Runs `request` on `task` and returns its result. A link that ended before the
        request reached the peer (it restarted since) is replaced once: the request never
        reached the new incarnation, so sending it again is safe. One that timed out is not:
        the task may still be serving it."""
        link, fresh = self.get(task)
        try:
            return link.call(request, self.timeout)
        except PeerLostError:
            if fresh:
                raise
        link, _ = self.get(task, instead_of=link)
        return link.call(request, self.timeout)

    def get(self, task, instead_of=None):
        """A live link to `task` other than `instead_of`, dialed when there is none, and
        whether it was just made."""
        deadline = time.monotonic() + self.timeout
        while True:
            link = self._first(task, instead_of)
            if link is not None:
                return link, False
            with self.dial_locks[task]:  # one dial per peer at a time; the others use its link
                link = self._first(task, instead_of)
                if link is not None:
                    return link, False
                if self._dial(task, deadline - time.monotonic()):
                    return self._first(task, instead_of), True
            with self.changed:  # refused: the peer dials this task; take its link
                self.changed.wait_for(lambda: self.closed or self._live(task, instead_of),
                                      min(OFFER_WAIT_S, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline and not self._live(task, instead_of):
                raise DeadlineExceeded(f"{self.name} got no control link to {task} within "
                                       f"{self.timeout:g} s: its offers were refused and no "
                                       f"link came from {task}",
                                       hint="the peer task is overloaded (see its log); raise "
                                            "RDMADEV_DEADLINE_S on a loaded machine")

    def _dial(self, task, timeout):
        """Dials `task` and keeps the link unless the peer refused the offer; whether kept."""
        with self.changed:
            self.dialing.add(task)
        try:
            link, answer = dial(self.address_of(task), self.secret, self.name, self.handler,
                                self.loop_of(), max(timeout, 0.1),
                                offer={"incarnation": self.incarnation}, where=task)
        finally:
            with self.changed:
                self.dialing.discard(task)
        if not (isinstance(answer, dict) and answer.get("kept", True)):
            link.close()  # it carried the offer alone: nothing is held on it
            return False
        link.dialed = True
        link.incarnation = answer.get("incarnation") if isinstance(answer, dict) else None
        self._keep(task, link)
        return True

    def offered(self, task, link, request):
        """`task` offers the connection `link` it dialed (the ``link`` request): kept for calls
        to it unless this task's own link wins (see the module). Returns the answer."""
        incarnation = request.get("incarnation")
        with self.changed:
            mine = [l for l in self.live.get(task, ()) if not l.broken]
            stale = [l for l in mine if l.incarnation != incarnation]
            wins = self.name < task and (task in self.dialing or any(
                l.dialed for l in mine if l not in stale))
        for old in stale:  # links to an earlier incarnation: it restarted
            old.close()
        if wins:
            with self.changed:
                self.refused += 1
            return {"kept": False, "incarnation": self.incarnation}
        link.incarnation = incarnation
        self._keep(task, link)
        return {"kept": True, "incarnation": self.incarnation}

    def stand(self, key, request):
        """Keeps `request`, which the caller sent to every task, standing under `key` until
        sit(key): a task whose link ends before then is sent it again once it is back (see
        the module)."""
        with self.changed:
            self.standing[key] = request

    def sit(self, key):
        """`key`'s request stands no more."""
        with self.changed:
            self.standing.pop(key, None)

    def _stand_again(self, task):
        """Dials `task` until it is back (within the deadline) and sends it every standing
        request: a thread of its own, started when the last link to `task` ended."""
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                with self.changed:
                    requests = list(self.standing.values())
                if self.closed or not requests:
                    return
                try:
                    link, _ = self.get(task)
                    for request in requests:
                        link.call(request, self.timeout)
                    return
                except (RdmadevError, OSError) as e:
                    if time.monotonic() + REDIAL_EVERY_S >= deadline:
                        log.info("rdmadev: %s did not come back within %g s to hold %d "
                                 "standing request(s): %s", task, self.timeout, len(requests), e)
                        return
                time.sleep(REDIAL_EVERY_S)
        finally:
            with self.changed:
                self.redialing.discard(task)

    def _first(self, task, instead_of):
        with self.changed:
            if self.closed:
                raise ClosedError(f"the control links of {self.name} are closed")
            return self._live(task, instead_of)

    def _live(self, task, instead_of):
        return next((l for l in self.live.get(task, ()) if not l.broken and l is not instead_of),
                    None)

    def _keep(self, task, link):
        """Keeps `link` to `task` until it ends."""
        with self.changed:
            closed = self.closed
            if not closed:
                self.live[task].append(link)
                self.changed.notify_all()
        if closed:
            link.close()
            return
        if self.heard is not None:
            link.heard = lambda: self.heard(task)
        link.ended.add_done_callback(lambda _: self._drop(task, link))

    def _drop(self, task, link):
        with self.changed:
            links = self.live.get(task, [])
            if link in links:
                links.remove(link)
            if not links:
                self.live.pop(task, None)
            again = (not links and self.standing and not self.closed
                     and task not in self.redialing)
            if again:
                self.redialing.add(task)
        if again:
            threading.Thread(target=self._stand_again, args=(task,), daemon=True,
                             name=f"rdmadev-redial {task}").start()

    def count(self):
        """(links open now, of them those the peers dialed): one per peer task, two for a
        moment while a new incarnation's replaces an old one's."""
        with self.changed:
            links = [l for ls in self.live.values() for l in ls]
        return len(links), sum(not l.dialed for l in links)

    def close(self):
        """Ends every link (the peers release what it held)."""
        with self.changed:
            self.closed = True
            links = [l for ls in self.live.values() for l in ls]
            self.changed.notify_all()
        for link in links:
            link.close()
