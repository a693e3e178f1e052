"""Optimized: the tf.function class rdmadev.optimize returns (api.py). It is TF's own class, so
TF takes it wherever it takes a tf.function; rdmadev adds reports, one call at a time per
object, naming of tasks that are gone, and the release of its instantiations on every task
once they are dropped. This module imports TensorFlow: api.py imports it on first use, so
`import rdmadev` does not."""
import functools
import os
import re
import threading

from tensorflow.python.eager.polymorphic_function import autograph_util, polymorphic_function
from tensorflow.python.framework import errors as tf_errors
from tensorflow.python.framework import ops as tf_ops

from ..cluster import instances, reports, runtime
from ..config import Config
from . import serving
from .pass_mode import load_into_process, opt_in_marker

__all__ = ["Optimized"]


class Optimized(polymorphic_function.Function):
    """A tf.function marked for rdmadev (api.py's docstring: how the mark opts it in). It is
    TF's own class, so TF takes it wherever it takes a tf.function; rdmadev adds `report` and
    `reports`."""

    #: Prepared in this process: the pass loaded, the serving tasks checked (_rdmadev_prepare).
    _rdmadev_ready = False
    #: TF's tracing count when this process last watched the traces (_rdmadev_watch_traces).
    _rdmadev_traced = 0
    #: Times traced inline into a caller (_rdmadev_inline), for `report`.
    _rdmadev_inlined = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Calls from Python threads run one at a time: each channel of an instantiation
        # carries one step at a time (its slots are reused by the next step), so two
        # overlapping calls would take each other's transfers. TF runs them concurrently.
        self._rdmadev_calls = threading.RLock()

    def __getstate__(self):
        # As TF's own, without the lock (it does not pickle) and without what holds only in
        # this process: a copy loaded elsewhere loads the pass and checks the tasks again at
        # its first call, and watches the traces it brings along.
        state = super().__getstate__()
        del state["_rdmadev_calls"]
        for per_process in ("_rdmadev_ready", "_rdmadev_traced"):
            state.pop(per_process, None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._rdmadev_calls = threading.RLock()

    def __call__(self, *args, **kwargs):
        if not self._rdmadev_ready:
            self._rdmadev_prepare()
        if tf_ops.inside_function():
            return self._rdmadev_inline(args, kwargs)
        try:
            with self._rdmadev_calls:
                return super().__call__(*args, **kwargs)
        except tf_errors.UnavailableError as e:
            named = serving.naming_gone_tasks(e)
            if named is e:
                raise
            raise named from e
        finally:
            self._rdmadev_watch_traces()

    def _rdmadev_inline(self, args, kwargs):
        # Called while another function is traced (Keras's train function calling
        # train_step, a step inside strategy.run): traced into it under the name scope
        # `<name>__rdmadev_<token>`, which opts the caller in (pass.cc, AddMarkedScope). A
        # nested tf.function would be a function of its own, and one that aggregates
        # gradients cannot be (TF: "merge_call called while defining a new graph").
        # Instantiations filed under the scope are released once this object is gone.
        scope = self._rdmadev_scope
        rt = runtime.current()
        if rt is not None:  # watched once (instances.py keys it by the scope)
            release = functools.partial(serving.broadcast, rt, serving.serving_tasks(rt))
            instances.watch_function(self, release, rt.links, name=scope)
        self._rdmadev_inlined += 1
        fn = self._python_function
        if self._autograph:  # as tf.function traces it
            fn = autograph_util.py_func_from_autograph(fn, self._experimental_autograph_options)
        with tf_ops.name_scope(scope):
            return fn(*args, **kwargs)

    @property
    def _rdmadev_scope(self):
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", self._name.rsplit(opt_in_marker(), 1)[0])
        return (prefix.lstrip("_.-") or "optimized") + opt_in_marker() + self.rdmadev_token

    def get_concrete_function(self, *args, **kwargs):
        # ClusterCoordinator.schedule traces here and sends the concrete function to a
        # worker: it never calls the function itself.
        if not self._rdmadev_ready:
            self._rdmadev_prepare()
        try:
            return super().get_concrete_function(*args, **kwargs)
        finally:
            self._rdmadev_watch_traces()

    def _rdmadev_watch_traces(self):
        # A task that instantiates a traced function (a ParameterServerStrategy worker)
        # cannot tell when this process drops it: tell every task then (instances.py).
        count = self.experimental_get_tracing_count()
        if count == self._rdmadev_traced or not self._rdmadev_ready:
            return
        self._rdmadev_traced = count
        rt = runtime.current()
        if rt is None:
            return
        tasks = serving.serving_tasks(rt)
        for concrete in self._list_all_concrete_functions():
            instances.watch_function(concrete._inference_function,  # pylint: disable=protected-access
                                     functools.partial(serving.broadcast, rt, tasks),
                                     rt.links)

    def _rdmadev_prepare(self):
        # In the coordinator: the pass must run here too (a call from the coordinator is
        # instantiated here), with a runtime to set up channels through.
        config = Config.from_env()
        load_into_process(auto=config.auto, on=config.enabled)
        cluster = getattr(self, "_rdmadev_cluster", None) or serving.connected_cluster()
        if cluster is None and "TF_CONFIG" not in os.environ:
            return  # one process, no cluster (yet): nothing crosses tasks; check next time
        if config.enabled:
            serving.check_tasks_serve(serving.coordinator(cluster))
        self._rdmadev_ready = True

    @property
    def rdmadev_token(self):
        return self._name.rsplit(opt_in_marker(), 1)[-1]

    @property
    def reports(self):
        """Reports of every instantiation of this function (or of one calling it), from
        every task that instantiated one, oldest first per task. Tasks that did not answer
        appear as a report saying so."""
        token = opt_in_marker() + self.rdmadev_token
        rt = serving.coordinator(getattr(self, "_rdmadev_cluster", None))
        gathered = serving.gather(rt, "reports")
        # this process's own, but those a task it runs answered for (an in-process cluster)
        out = [r for r in reports.reports() if r.concerns(token) and r.task not in gathered]
        for task, result in gathered.items():
            if isinstance(result, Exception):
                out.append(reports.Report.unreachable(task, result))
                continue
            out += [r for r in map(reports.Report.from_dict, result) if r.concerns(token)]
        return out

    @property
    def report(self):
        r = self.reports
        if r:
            return "\n".join(map(str, r))
        if self.experimental_get_tracing_count() or self._rdmadev_inlined:
            return "rdmadev: no cross-task transfer in this function (nothing to rewrite)"
        return "rdmadev: not called yet"
