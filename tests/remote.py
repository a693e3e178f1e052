"""A peer task for tests: a spawned process (optionally inside a network namespace) with
its own rdmadev Domain that runs the functions of tests/remote_ops.py on request."""
import multiprocessing
import os
import signal

from rdmadev.testing import pair


def _main(conn, name, fabric, secret, tcp_addr, netns):
    import netns as netns_module  # the tests directory is on sys.path in the child too
    import remote_ops  # noqa
    from rdmadev import Config, open_domain

    if netns:
        netns_module.enter(netns)
    state = {"regions": {}, "remotes": {}, "endpoints": {}}
    try:
        state["domain"] = open_domain(name, Config(fabric=fabric, secret=secret), tcp_addr=tcp_addr)
        conn.send(state["domain"].address)
    except BaseException as e:  # report, do not lose it
        conn.send(e)
        return
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send(("ok", getattr(remote_ops, fn)(state, *args)))
        except BaseException as e:
            conn.send(("err", e))
    state["domain"].close()


class RemotePeer:
    """Handle on the peer process.

    Example:
        >>> with RemotePeer("tcp", SECRET) as peer:
        ...     desc = peer.call("alloc", "ring", 4096)
    """

    def __init__(self, fabric, secret, name="peer", tcp_addr="127.0.0.1:0", netns=None,
                 timeout=60.0):
        self.proc, self.conn = pair.spawn(_main, name, fabric, secret, tcp_addr, netns)
        self.timeout = timeout
        self.pending = 0  # send()s whose result() was not collected
        self.address = pair.recv(self.conn, timeout, self.proc)

    @property
    def pid(self):
        return self.proc.pid

    def call(self, fn, *args, timeout=None):
        """Runs remote_ops.fn(state, *args) in the peer; returns its result or raises its error."""
        self.conn.send((fn, args))
        status, value = pair.recv(self.conn, timeout or self.timeout, self.proc)
        if status == "err":
            raise value
        return value

    def send(self, fn, *args):
        """Starts remote_ops.fn without waiting; collect with result()."""
        self.conn.send((fn, args))
        self.pending += 1

    def result(self, timeout=None):
        status, value = pair.recv(self.conn, timeout or self.timeout, self.proc)
        self.pending -= 1
        if status == "err":
            raise value
        return value

    def kill(self):
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def close(self):
        if self.proc.is_alive():
            pair.stop(self.proc, self.conn)
        self.proc.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
