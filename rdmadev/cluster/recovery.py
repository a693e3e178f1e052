"""Broken connections: the channels between two tasks that both still run are set up again
(Recovery, a part of ChannelTable that owns its state: ``table.recovery``).

A connection can break while both of its tasks run: a verbs transfer or queue pair
that failed (a write later than the late-write grace, a link down past the retry
budget), a tcp connection cut (a refused frame, a reset). The table's watcher, or the
table finding a dead endpoint, unbinds every half with the peer (ChannelTable's
sweep_dead_peers); steps of the instantiations TF still holds would then find no halves.
So the table tells Recovery (``broke``), and each task that saw it (_recover):

    ping   -> peer                        the same process still? (its Domain address)
    reopen    here (sender: the peer)     pairs the peer sends here, set up again
    reopen -> peer (sender: this task)    pairs this task sends the peer

reopen sets up again, as open_pairs did, each pair from its sender that an instantiation
still holds here and that lost a half on either task (bound_senders asks the sender):
both tasks may see one break, and a pair set up again is whole the second time. Half
pairs (TF1) are met again likewise, those whose receiving half a graph's kernels still
hold here, or will (HalfPairs.held), one setup at a time with new graphs' offers
(HalfPairs.one_at_a_time: two setups of one key crossing would bind a sender to the
other's ring). The step the break hit fails, and so does one that looks for the halves
before they are bound again (Unavailable: they are marked lost, registry.h UnbindPeer),
once the ping's verdict is in (judge): as a transient failure if the peer still runs, else
naming the peer task in the words TF's gRPC uses, so that TF's ClusterCoordinator tells a
lost ps (raised to the user) from a lost worker (its closure runs again). The next run
on fresh rings (epoch 0 on both sides; a late write of the failed step
carries its step tag and is discarded).
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
    """Setting up again the channels of a connection that broke (the module's docstring).
    Its state is its own: a lock letting one reopen run at a time (both tasks may ask), and
    ``reopened``, how many pairs it set up again.

    Args:
        table: the ChannelTable it is a part of. Recovery asks it to look for dead peers
            (``sweep_dead_peers``), for the pairs it received (``received_from``,
            ``still_received``) and to release and notify (``release``, ``notify``), and
            reads its ``task``, ``call`` and ``closing``.
        halves: the table's HalfPairs, whose held halves it meets again (``one_at_a_time``,
            ``held``, ``meet_again``).
        growth: the table's Growth, which sets a pair up again with the slots its channels
            learned (``open_as_learned``).
    """

    #: The control requests it serves (ChannelTable.handle routes them here).
    REQUESTS = ("reopen", "bound_senders")

    def __init__(self, table, halves, growth):
        self.table = table
        self.halves = halves
        self.growth = growth
        self.reopening = threading.Lock()  # one reopen at a time: both tasks may ask
        self.reopened = 0  # pairs set up again after their connection broke (reopen)

    def broke(self, task, address):
        """The connection to `task`, whose Domain was at `address`, died (its halves here went):
        sets up again, in the background, the channels between this task and `task` if that
        task still runs (_recover)."""
        threading.Thread(target=self._recover, args=(task, address), daemon=True,
                         name=f"rdmadev-recover {task}").start()

    def counters(self):
        """``{"reopened": pairs set up again}`` (ChannelTable.counters)."""
        return {"reopened": self.reopened}

    def _recover(self, task, address):
        """broke's background half: sets up again the pairs between this task and `task`
        (the module docstring), if `task` is the process its Domain `address` belonged to."""
        table = self.table
        try:
            same = table.call(task, {"op": "ping"})["address"] == address
        except Exception as e:  # gone: TF fails the steps that need it
            log.info("rdmadev: %s does not answer (%s); its channels here stay unbound", task,
                     reason_of(e))
            self.judge(task, f"task {task} is gone: it does not answer ({reason_of(e)})")
            return
        if not same:  # restarted: TF instantiates its functions again
            self.judge(task, f"task {task} restarted: another process answers at its address")
            return
        self.judge(task, None)
        if table.closing.is_set():
            return
        try:
            n = self.reopen({"sender": task})["reopened"]
            n += table.call(task, {"op": "reopen", "sender": table.task})["reopened"]
        except Exception as e:
            log.warning("rdmadev: the connection between %s and %s broke while both run, and "
                        "their channels could not all be set up again: %s", table.task, task,
                        reason_of(e))
            return
        if n:
            log.warning("rdmadev: the connection between %s and %s broke while both run; "
                        "%d region(s) of channels between them were set up again", table.task,
                        task, n)

    def judge(self, task, gone):
        """The verdict on `task`, whose halves here went with a broken connection: `gone`
        None, it still runs (a step finding one of them lost is a transient failure, run
        again once they are set up again); else why it does not, which such a step fails
        with, naming the task as TF's gRPC does: TF's ClusterCoordinator raises a lost ps to
        the user and runs a lost worker's closures again (registry.h PeerVerdict)."""
        _core.peer_verdict(self.table.domain, task, gone)

    def reopen(self, r):
        """Sets up again each pair task ``r["sender"]`` sends here that lost a half to a
        broken connection, on this task or the sender (the module docstring).

        Returns:
            ``{"reopened": pairs set up again}``.
        """
        sender, table = r["sender"], self.table
        with self.reopening, self.halves.one_at_a_time():
            table.sweep_dead_peers()  # a break this task has not looked at yet
            held = table.received_from(sender)
            halves = self.halves.held(sender)
            if not (held or halves) or table.closing.is_set():
                return {"reopened": 0}
            keys = [c["key"] for _, p in held for c in p["channels"]] + [c["key"] for c in halves]
            whole = set(table.call(sender, {"op": "bound_senders", "keys": keys}))
            whole &= {k[len("recv:"):] for k in _core.bound_channels() if k.startswith("recv:")}
            broken = [(i, p) for i, p in held if any(c["key"] not in whole for c in p["channels"])]
            n = sum(self._reopen_pair(instance, p) for instance, p in broken)
            torn = [c for c in halves if c["key"] not in whole]
            if torn:
                n += self._set_up_again(sender, [c["key"] for c in torn],
                                        lambda: self.halves.meet_again(sender, torn))
            self.reopened += n
            return {"reopened": n}

    def _reopen_pair(self, instance, p):
        """open_pairs again for one pair of `instance`, with the slots its channels grew to
        (learned): True if it is set up. If that fails, the steps using its channels fail at
        once on both tasks, saying why (and the fix of the cause, when it names one)."""
        sender, keys = p["sender"], [c["key"] for c in p["channels"]]
        # a channel may have grown since the pair was opened
        if not self._set_up_again(sender, keys, lambda: self.growth.open_as_learned(instance, p)):
            return False
        if not self.table.still_received(instance):  # released meanwhile: what was bound goes
            self.table.release({"keys": keys, "half": "recv"})
            self.table.notify(sender, keys, "send")
        return True

    def _set_up_again(self, sender, keys, setup):
        """Runs ``setup()``, which sets up again the channels `keys` from `sender`: True if it
        did. If not, the steps using them fail at once on both tasks with why (and the fix of
        the cause, when it names one)."""
        try:
            setup()
        except Exception as e:
            failed = [f"its connection to task {sender} broke and setting the pair up again "
                      f"failed: {reason_of(e)}", getattr(e, "hint", None) or REOPEN_FIX]
            self.table.release({"keys": keys, "half": "recv", "failed": failed})
            self.table.notify(sender, keys, "send", failed=failed)
            log.warning("rdmadev: %d channel(s) from %s to %s (first %s) stay unbound, and the "
                        "steps using them fail: %s", len(keys), sender, self.table.task, keys[0],
                        failed[0])
            return False
        return True

    def bound_senders(self, r):
        """The channels of ``r["keys"]`` whose sending half is bound here, on a connection
        that has not broken (reopen asks)."""
        self.table.sweep_dead_peers()
        bound = set(_core.bound_channels())
        return [k for k in r["keys"] if "send:" + k in bound]
