"""Broken connections: the channels between two tasks that both still run are set up again
(Recovery, a part of ChannelTable: its state is ChannelTable's, set up in its __init__).

A connection can break while both of its tasks run: a verbs transfer or queue pair
that failed (a write later than the late-write grace, a link down past the retry
budget), a tcp connection cut (a refused frame, a reset). The watcher of a task that
sees it unbinds every half with the peer (_bury_locked); steps of the instantiations TF
still holds would then find no halves. So each task that saw it (_recover):

    ping   -> peer                        the same process still? (its Domain address)
    reopen    here (sender: the peer)     pairs the peer sends here, set up again
    reopen -> peer (sender: this task)    pairs this task sends the peer

reopen sets up again, as open_pairs did, each pair from its sender that an instantiation
still holds here and that lost a half on either task (bound_senders asks the sender):
both tasks may see one break, and a pair set up again is whole the second time. Half
pairs (TF1) are met again likewise, those whose receiving half a graph's kernels still
hold here, or will (_held_halves_locked), one setup at a time with new graphs' offers
(meeting: two setups of one key crossing would bind a sender to the other's ring). The
step the break hit fails, and so does one that looks for the halves before they are
bound again (Unavailable: they are marked lost, registry.h UnbindPeer); the next run on
fresh rings (epoch 0 on both sides; a late write of the failed step carries its step tag
and is discarded).
"""
import logging
import threading

from .. import _core
from .channel_common import reason_of

__all__ = ["Recovery", "REOPEN_FIX"]

#: The fix named when the channels of a connection that broke cannot be set up again.
REOPEN_FIX = ("retrace or re-create the function or TF1 session that uses them (or restart "
              "the job); `rdmadev doctor` checks the fabric between the two tasks")

log = logging.getLogger("rdmadev.cluster.channels")  # channel setup logs as one, whichever part


class Recovery:
    """ChannelTable's requests and helpers for broken connections (see the module's
    docstring)."""

    def _recover(self, task, address):
        """_buried's background half: sets up again the pairs between this task and `task`
        (the module docstring), if `task` is the process its Domain `address` belonged to."""
        try:
            same = self.call(task, {"op": "ping"})["address"] == address
        except Exception as e:  # gone: TF fails the steps that need it
            log.info("rdmadev: %s does not answer (%s); its channels here stay unbound", task,
                     reason_of(e))
            return
        if not same or self.closing.is_set():  # restarted: TF instantiates its functions again
            return
        try:
            n = self.reopen({"sender": task})["reopened"]
            n += self.call(task, {"op": "reopen", "sender": self.task})["reopened"]
        except Exception as e:
            log.warning("rdmadev: the connection between %s and %s broke while both run, and "
                        "their channels could not all be set up again: %s", self.task, task,
                        reason_of(e))
            return
        if n:
            log.warning("rdmadev: the connection between %s and %s broke while both run; "
                        "%d region(s) of channels between them were set up again", self.task,
                        task, n)

    def reopen(self, r):
        """Sets up again each pair task ``r["sender"]`` sends here that lost a half to a
        broken connection, on this task or the sender (the module docstring).

        Returns:
            ``{"reopened": pairs set up again}``.
        """
        sender = r["sender"]
        with self.reopening, self.meeting:
            self._sweep_dead_peers()  # a break this task has not looked at yet
            with self.lock:
                held = [(i, p) for i, pairs in self.received.items() for p in pairs
                        if p["sender"] == sender]
                halves = self._held_halves_locked(sender)
            if not (held or halves) or self.closing.is_set():
                return {"reopened": 0}
            keys = [c["key"] for _, p in held for c in p["channels"]] + [c["key"] for c in halves]
            whole = set(self.call(sender, {"op": "bound_senders", "keys": keys}))
            whole &= {k[len("recv:"):] for k in _core.bound_channels() if k.startswith("recv:")}
            broken = [(i, p) for i, p in held if any(c["key"] not in whole for c in p["channels"])]
            n = sum(self._reopen_pair(instance, p) for instance, p in broken)
            torn = [c for c in halves if c["key"] not in whole]
            if torn:
                n += self._reopen_halves(sender, torn)
            self.reopened += n
            return {"reopened": n}

    def _reopen_pair(self, instance, p):
        """open_pairs again for one pair of `instance`, with the slots its channels grew to
        (learned): True if it is set up. If that fails, the steps using its channels fail at
        once on both tasks, saying why (and the fix of the cause, when it names one)."""
        sender, keys = p["sender"], [c["key"] for c in p["channels"]]
        try:  # a channel may have grown since the pair was opened
            self._open_as_learned(instance, p)
        except Exception as e:
            self._not_reopened(sender, keys, e)
            return False
        with self.lock:
            released = instance not in self.received
        if released:  # meanwhile: what was just bound goes too
            self.release({"keys": keys, "half": "recv"})
            self._notify(sender, keys, "send")
        return True

    def _not_reopened(self, sender, keys, e):
        """The channels `keys` from `sender` could not be set up again (`e`): the steps using
        them fail at once on both tasks with why (and the fix of the cause, when it names one)."""
        failed = [f"its connection to task {sender} broke and setting the pair up again "
                  f"failed: {reason_of(e)}", getattr(e, "hint", None) or REOPEN_FIX]
        self.release({"keys": keys, "half": "recv", "failed": failed})
        self._notify(sender, keys, "send", failed=failed)
        log.warning("rdmadev: %d channel(s) from %s to %s (first %s) stay unbound, and the "
                    "steps using them fail: %s", len(keys), sender, self.task, keys[0],
                    failed[0])

    def bound_senders(self, r):
        """The channels of ``r["keys"]`` whose sending half is bound here, on a connection
        that has not broken (reopen asks)."""
        self._sweep_dead_peers()
        bound = set(_core.bound_channels())
        return [k for k in r["keys"] if "send:" + k in bound]

    def _sweep_dead_peers(self):
        """Unbinds the halves whose peer's endpoint died, and sets up again those of peers
        that still run (_buried)."""
        with self.lock:
            dead = [(a, ep) for a, ep in self.endpoints.items() if not ep.alive()[0]]
            buried = [self._bury_locked(address, ep) for address, ep in dead]
        for (address, ep), (n, why) in zip(dead, buried):
            self._buried(address, ep, n, why)

    def _bury_locked(self, address, ep):
        """Forgets the dead endpoint `ep` to `address` and unbinds every half on it, under
        self.lock: a half bound on the endpoint that replaces it is bound after this (halves
        with the same task on another endpoint stay: a peer restarted at once, its new
        instantiations set up already, within WATCH_INTERVAL_S).
        Until then, a step looking for one of them fails at once, as Unavailable: one that
        began before the break must not take the halves set up again for the steps after.
        Returns how many halves went and why the endpoint died."""
        del self.endpoints[address]
        task = self.peers.get(address)
        why = ep.alive()[1] if not ep.closed else "closed"
        if not task:
            return 0, why
        lost = (f"task {task} is gone or the connection to it broke ({why}); the channels of a "
                "task that still runs are set up again")
        return _core.unbind_peer(self.domain, task, lost, via=ep), why

    def _buried(self, address, ep, unbound, why):
        """Says `why` the endpoint to `address` died (`unbound` halves went with it), closes
        it, and, in the background, sets up again the channels between this task and its
        peer if that task still runs (_recover): a connection can break with both tasks
        running (a failed verbs transfer or queue pair, a tcp connection cut)."""
        task = self.peers.get(address)
        log.info("rdmadev: connection to %s (%s) is gone: %s; unbound %d channel half(s)", task,
                 address, why, unbound)
        ep.close()
        if task is not None and not self.closing.is_set():
            threading.Thread(target=self._recover, args=(task, address), daemon=True,
                             name=f"rdmadev-recover {task}").start()
