"""One event loop per task: its control service, its control links to its peers and its
heartbeats run on one thread, whatever the number of peers (EventLoop).

Before, each served control connection and each heartbeat lane had a thread of its own: a ps
with N workers ran about 6 N of them (issue 60). Now a connection costs its descriptor and a
coroutine, and heartbeats one datagram socket for every peer; work that may block (a request that sets up channels and calls other tasks, a
handshake, a connect, releasing what a connection held) runs on ``Workers``, threads started
when none is idle and ended after IDLE_S without work, so that what is left at rest does not
grow with the peers.

Example:
    >>> loop = EventLoop("/job:ps/replica:0/task:0")
    >>> loop.submit(some_coroutine())   # a concurrent.futures.Future
    >>> loop.close()
"""
import asyncio
import concurrent.futures
import logging
import queue
import threading

__all__ = ["EventLoop", "Workers", "IDLE_S", "WORK_THREAD"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Seconds a worker thread waits for more work before it ends.
IDLE_S = 5.0
#: How a worker thread's name starts.
WORK_THREAD = "rdmadev-work"


class Workers(concurrent.futures.Executor):
    """Threads for blocking work, as many as run at once: a call starts a thread only when
    none is idle, and a thread ends after IDLE_S with nothing to do. Unbounded on purpose: a
    request's handler may wait for a call to another task whose handler waits for this one
    (setup goes both ways), and a bounded pool would deadlock there.

    Args:
        name: the thread names' suffix (the task).
    """

    def __init__(self, name):
        self.name = name
        self.work = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0
        self.running = 0  # threads alive
        self.closed = False

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        with self.lock:
            if self.closed:
                raise RuntimeError(f"the workers of {self.name} are closed")
            self.work.put((future, fn, args, kwargs))
            if self.idle:
                self.idle -= 1  # that thread takes it
                return future
            self.running += 1
        threading.Thread(target=self._run, daemon=True, name=f"{WORK_THREAD} {self.name}").start()
        return future

    def _run(self):
        while True:
            try:
                item = self.work.get(timeout=IDLE_S)
            except queue.Empty:
                with self.lock:
                    if self.work.empty() or self.closed:  # nothing was handed to it meanwhile
                        self.idle -= 1
                        self.running -= 1
                        return
                continue
            if item is None:
                with self.lock:
                    self.running -= 1
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # handed to whoever waits for it
                    future.set_exception(e)
            del item, future, fn, args, kwargs
            with self.lock:
                self.idle += 1

    def threads(self):
        """Worker threads alive now (busy or idle)."""
        with self.lock:
            return self.running

    def shutdown(self, wait=True, *, cancel_futures=False):
        with self.lock:
            self.closed = True
            running = self.running
        for _ in range(running):
            self.work.put(None)


class EventLoop:
    """An asyncio loop on a thread of its own, and its Workers (``workers``) for what blocks.

    Args:
        name: the task it serves, for its threads' names.
    """

    def __init__(self, name):
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.workers = Workers(name)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name=f"rdmadev-loop {name}")
        self.thread.start()

    def submit(self, coroutine):
        """Runs `coroutine` on the loop; returns its concurrent.futures.Future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, fn, *args):
        """Runs `fn(*args)` on the loop's thread and returns its result (from any other
        thread; on the loop's own it runs at once)."""
        if threading.current_thread() is self.thread:
            return fn(*args)

        async def run():
            return fn(*args)
        return self.submit(run()).result()

    def close(self):
        """Cancels what runs on the loop, stops it and its workers (idempotent)."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            async def cancel_all():
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            try:
                self.submit(cancel_all()).result(timeout=10)
            except Exception as e:  # a task that would not end: the loop stops anyway
                log.info("rdmadev: tasks of %s's loop did not end: %s", self.name, e)
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self.thread is not threading.current_thread():
                self.thread.join(10)
        self.workers.shutdown()
        if not self.thread.is_alive():
            self.loop.close()
