"""What keeps an instantiation's channels alive, and releasing them when it goes.

Measured on TensorFlow 2.21 (tests/test_lifecycle.py): the tasks never destroy the kernels of
a multi-task function instantiation. The client's ``ProcessFunctionLibraryRuntime::
ReleaseMultiDeviceHandle`` returns Unimplemented for remote components ("Implement
DeregisterGraph call to remote device"), and a task keeps each component function in its
eager context's kernel cache under the component's own name, which nobody removes: not when
the client drops the function (it removes only the function's own name), not when the
client exits (60 s later the kernels are still there). Under ParameterServerStrategy the
worker that instantiates behaves the same, for its own component and for the ps's.

So kernels cannot own their channels (TF also destroys and re-creates the kernels of a
function it still runs when a ParameterServerStrategy worker fails), and the sound trigger
lies in the process that planned: an instantiation runs only through the function TF was
calling when it was planned, and only while that function is registered in that process's
eager context. ``track`` finds the function this thread is calling (the AtomicFunction whose
call tf/calls.py noted: ``calling``), watches it, and once it is garbage-collected and its
name is no longer registered (``Context.has_function``), asks every task of the
instantiation to release its channels. At interpreter exit every instantiation still tracked
is released.

An instantiation planned outside a Python call (a worker partitioning a ParameterServerStrategy
step in a TF thread) has no such owner there. Its owner lives in another process: the
coordinator that traced the function and sent it, under the same name, to the worker. So the
planner files it under its function's name, and the coordinator's ``rdmadev.optimize`` watches
each function it traces (``watch_function``): once that is gone too, it sends
``release_function`` to every task, and the task that planned releases the instantiations filed
under that name (``release_function``). The coordinator also tells every task it owns the
function (``own_function``), over the control connection it keeps open: should that connection
end before release_function (the coordinator was killed, or exited without it), the task
releases then (control.Session). A task that restarts meanwhile is told again once it is back
(a standing request: links.py). Channels a killed process planned itself go the same way
(open_pairs is held by the connection it came on).
"""
import atexit
import collections
import contextlib
import logging
import queue
import threading
import weakref

from .control import session

__all__ = ["track", "tracked", "calling", "owner_of_current_call", "watch_function",
           "release_function", "own_function", "release_on_tasks"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Seconds between re-checks of a collected function whose name is still registered (another
#: AtomicFunction object shares the registration): only such deferred ones are polled.
RECHECK_S = 1.0
#: Function names released here that a task remembers: an instantiation planned for one of them
#: afterwards (TF ran a closure of it while its owner exited) is released as soon as it is filed.
RELEASED_NAMES_KEPT = 4096

_lock = threading.Lock()
_the_tracker = None


_calls = threading.local()  # .stack: the functions this thread is calling, innermost last


@contextlib.contextmanager
def calling(owner):
    """Notes that this thread calls `owner` (a TF AtomicFunction) for the block: TF plans an
    instantiation inside the call that instantiates it, on the calling thread
    (tf/calls.py wraps every call). Nothing else is kept: reading the frames' locals
    instead (frame.f_locals) kept a snapshot of every frame's locals alive, and with it
    functions their callers had dropped."""
    stack = _calls.__dict__.setdefault("stack", [])
    stack.append(owner)
    try:
        yield
    finally:
        stack.pop()


def owner_of_current_call():
    """The TensorFlow AtomicFunction this thread is calling (innermost), or None: none is
    for a thread TF started itself, and for an eager op outside any function call."""
    stack = getattr(_calls, "stack", None)
    return stack[-1] if stack else None


def release_on_tasks(call, instance, tasks, keys, evicted=False, quiescent=False):
    """Asks every task of `instance` to unbind its channels (best effort); `evicted`: to make
    room for another plan, the instantiation to be set up again when it runs (evictions.py;
    the tasks count it); `quiescent`: no transfer of it is in flight (ChannelTable.release)."""
    request = {"op": "release", "instance": instance, "keys": keys, "half": "both"}
    if evicted:
        request["evicted"] = True
    if quiescent:
        request["quiescent"] = True
    for task in tasks:
        try:
            call(task, request)
        except Exception as e:  # a dead task took its channels with it
            log.info("rdmadev: could not release instance %s at %s: %s", instance, task, e)


def _name_of(fn):
    return fn.name.decode() if isinstance(fn.name, bytes) else fn.name


class _Tracker:
    """Functions watched until TF drops them, each with what to release then (a local
    instantiation's channels, or a function's instantiations on other tasks), and the
    instantiations planned here for functions owned elsewhere, by function name. Releases
    run on its own thread (finalizers only enqueue)."""

    def __init__(self):
        self.live = {}  # watch id -> (release(), function name, context)
        self.by_function = {}  # function name -> {instance: release()}, owned elsewhere
        # Names released here, newest last (at most RELEASED_NAMES_KEPT): an instantiation
        # filed for one later (planned while its owner exited) is released at once.
        self.released_names = collections.OrderedDict()
        self.gone = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.releasing = threading.Lock()  # held while a release runs
        self.released = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="rdmadev-instances")
        self.thread.start()
        atexit.register(self.release_all)

    def add(self, owner, key, release):
        """Runs `release()` once `owner` (an AtomicFunction, or any object without a context)
        is collected and, for an AtomicFunction, its name is no longer registered in its
        context; `key` names the entry."""
        context = getattr(owner, "_bound_context", None)
        with self.lock:
            if key in self.live:
                return
            self.live[key] = (release, _name_of(owner) if context is not None else "", context)
        fin = weakref.finalize(owner, self.gone.put, key)
        fin.atexit = False  # release_all does it, in order, before the runtime closes

    def file(self, functions, instance, release):
        with self.lock:
            late = any(function in self.released_names for function in functions)
            if not late:
                for function in functions:
                    self.by_function.setdefault(function, {})[instance] = release
        if late:  # its owner let it go while it was planned: released now, off the planner
            threading.Thread(target=release, daemon=True, name=f"rdmadev-late {instance}").start()
            with self.lock:
                self.released += 1

    def release_function(self, function):
        with self.lock:
            self.released_names[function] = None
            while len(self.released_names) > RELEASED_NAMES_KEPT:
                self.released_names.popitem(last=False)
            owned = self.by_function.pop(function, {})
            for name in list(self.by_function):  # filed under other names too: released once
                others = self.by_function[name]
                for instance in owned:
                    others.pop(instance, None)
                if not others:
                    del self.by_function[name]
        for release in owned.values():
            release()
        with self.lock:
            self.released += len(owned)
        return len(owned)

    def _registered(self, key):
        _, name, context = self.live[key]
        try:
            return bool(context is not None and context.has_function(name))
        except Exception:  # the context is being torn down: the function is gone
            return False

    def _run(self):
        deferred = set()
        while True:
            try:
                deferred.add(self.gone.get(timeout=RECHECK_S if deferred else None))
            except queue.Empty:
                pass
            for key in list(deferred):
                with self.lock:
                    known = key in self.live
                if not known:
                    deferred.discard(key)
                elif not self._registered(key):
                    deferred.discard(key)
                    self.release(key)

    def release(self, key):
        with self.releasing:
            with self.lock:
                entry = self.live.pop(key, None)
            if entry is None:
                return
            entry[0]()
            with self.lock:
                self.released += 1

    def release_all(self):
        # Waits for a release the thread is running: at exit the thread dies with the process.
        with self.releasing, self.lock:
            keys = list(self.live)
        for key in keys:
            self.release(key)


def _tracker():
    global _the_tracker
    with _lock:
        if _the_tracker is None:
            _the_tracker = _Tracker()
    return _the_tracker


def track(call, instance, transfers, function="", marked=()):
    """Releases the channels of `instance` (its swapped `transfers`) on every task once the
    function being called on this thread is gone, or, when none is (a TF thread planning for
    a function another process called), once the owner of `function` or of one of the
    optimized functions it calls (`marked`) asks (release_function): Keras schedules its own
    train function, which calls the train_step that rdmadev.optimize wrapped and watches.
    Returns False when the instantiation is not tracked (no owner and no function name)."""
    tasks = sorted({t.recv_task for t in transfers} | {t.send_task for t in transfers})
    keys = [t.channel_key for t in transfers]

    def release():
        release_on_tasks(call, instance, tasks, keys)

    owner = owner_of_current_call()
    if owner is not None:
        _tracker().add(owner, ("instance", instance), release)
    elif function:
        _tracker().file({function, *marked}, instance, release)
    else:
        return False
    return True


def watch_function(function, broadcast, links, name=None):
    """Calls ``broadcast({"op": "release_function", "function": name})`` once TF dropped
    `function` (an AtomicFunction: collected, no longer registered; anything else: collected)
    in this process, or at exit. `links` (this process's Links): its own_function stands until
    then, so that a task that restarts in the meantime holds it too (links.py). `name`: the
    function's own name unless given."""
    name = name or _name_of(function)
    own = {"op": "own_function", "function": name}
    broadcast(own)
    links.stand(("function", name), own)

    def release():
        links.sit(("function", name))
        broadcast({"op": "release_function", "function": name})
    _tracker().add(function, ("function", name), release)


def release_function(request):
    """The ``release_function`` control request: releases the instantiations planned here
    for function ``request["function"]``; returns how many."""
    owner = session()
    if owner is not None:
        owner.let_go(("function", request["function"]))
    return _tracker().release_function(request["function"])


def own_function(request):
    """The ``own_function`` control request: the process that traced function
    ``request["function"]`` (and will ask for release_function once it drops it) holds it
    through this connection. Should the connection end first (that process was killed), the
    instantiations planned here for the function are released then."""
    owner = session()
    if owner is not None:
        name = request["function"]
        owner.hold(("function", name), lambda: _tracker().release_function(name))
    return owner is not None


def tracked():
    """{"live": entries watched or filed, "released": released so far} in this process."""
    t = _the_tracker
    if t is None:
        return {"live": 0, "released": 0}
    with t.lock:
        filed = sum(len(v) for v in t.by_function.values())
        return {"live": len(t.live) + filed, "released": t.released}
