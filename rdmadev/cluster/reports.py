"""Reports: what each planned instantiation moved where, kept per process.

The TF bridge records one Report per instantiation it planned; the runtime serves them to
other tasks (the ``reports`` control request) and ``rdmadev.optimize(fn).report`` prints them.

Example:
    >>> record(Report("1f.0", swapped=[], kept=[], registered={}))
    >>> print(reports()[-1])
    rdmadev instance 1f.0: no cross-task transfer (nothing to do)
"""
import dataclasses
import threading

__all__ = ["CONTROL", "Report", "record", "reports"]

#: The dtype a report gives a swapped control edge: TF's partitioner turns a control edge
#: between tasks into a pair carrying an empty tensor; rdmadev sends the signal alone.
CONTROL = "control"

_reports = []
_lock = threading.Lock()


@dataclasses.dataclass
class Report:
    """What one instantiation moved where."""

    instance: str
    swapped: list        # [(tensor_name, send_task -> recv_task, dtype or CONTROL, bytes, fabric[+zc])]
    kept: list           # [(tensor_name, send_task -> recv_task, reason)]
    registered: dict     # recv task -> bytes registered there
    function: str = ""   # the instantiated function's name
    task: str = ""       # where it was planned ("coordinator" outside any task)
    marked: list = dataclasses.field(default_factory=list)  # rdmadev.optimize'd names it holds
    #: swapped tensor names inside a while loop: one transfer per iteration, and the loop runs
    #: one iteration at a time on each task (pass.cc, RunIterationsInOrder)
    looped: list = dataclasses.field(default_factory=list)
    #: swapped tensor name of run-time shape -> [payload bytes its slots start with, whether
    #: that is the bound TF's shapes give it (else RDMADEV_DYNAMIC_CAPACITY or a hint)]
    capacities: dict = dataclasses.field(default_factory=dict)
    #: swapped tensor name -> the bundle (graph_pass.bundles) it shares a channel with, short id
    bundled: dict = dataclasses.field(default_factory=dict)
    #: swapped tensor name -> the devices, not CPUs, of its ends: each crosses to or from its
    #: task's CPU by TF's own copy, one device copy a step (pass.cc, host_hop.h)
    via_host: dict = dataclasses.field(default_factory=dict)
    error: str = ""      # set when the report could not be read (see unreachable)

    @classmethod
    def from_dict(cls, d):
        """The Report a task sent (``dataclasses.asdict`` of one)."""
        return cls(**d)

    @classmethod
    def unreachable(cls, task, error):
        """Stands for the reports of a task that did not answer."""
        return cls("-", [], [], {}, task=task, error=str(error))

    def concerns(self, name_part):
        """Whether this instantiation is, or calls, a function whose name holds `name_part`."""
        return name_part in self.function or any(name_part in m for m in self.marked)

    def __str__(self):
        if self.error:
            return f"rdmadev: no reports from {self.task}: {self.error}"
        at = " ".join(x for x in (self.function, self.task and f"on {self.task}") if x)
        where = f" ({at})" if at else ""
        head = f"rdmadev instance {self.instance}{where}"
        lines = [f"{head}: {len(self.swapped)} transfers swapped, {len(self.kept)} stayed on gRPC"]
        if not self.swapped and not self.kept:
            lines[0] = f"{head}: no cross-task transfer (nothing to do)"
        looped = set(self.looped)
        for name, route, dtype, nbytes, fabric in self.swapped:
            what = "run-time shape" if nbytes is None else f"{nbytes} B"
            if name in self.capacities:
                cap, bounded = self.capacities[name]
                what += f", slots of {cap} B" + (" (its bound from TF's shapes)" if bounded else "")
            if dtype == CONTROL:
                dtype, what = "control edge", "(orders execution, carries no data)"
            if name in looped:
                what += " each loop iteration"
            if name in self.bundled:
                fabric += f" bundle {self.bundled[name]}"
            if name in self.via_host:
                what += " via host from/to " + ", ".join(self.via_host[name])
            lines.append(f"  {fabric:<8} {route}  {name} {dtype} {what}")
        if self.bundled:
            lines.append(f"  {len(self.bundled)} small tensors share {len(set(self.bundled.values()))} "
                         f"bundle(s): one write and one wait move each bundle")
        if self.via_host:
            copies = sum(len(d) for d in self.via_host.values())
            copied = sum(len(self.via_host[n]) * (b or 0) for n, _, _, b, _ in self.swapped if n in self.via_host)
            lines.append(f"  {len(self.via_host)} swapped with an end on a device other than its task's CPU "
                         f"cross via host: {copies} device copies a step ({copied} B of static shape)")
        if looped:
            lines.append(f"  {len(looped)} swapped in while loops: their loops run one iteration at a "
                         f"time on each task that sends or receives them")
        for name, route, reason in self.kept:
            lines.append(f"  grpc     {route}  {name} ({reason})")
        moved, dynamic = self.bytes_per_step()
        for task, nbytes in sorted(self.registered.items()):
            step = f"{moved.get(task, 0)} B a step"
            if task in dynamic:
                step += " + tensors of run-time shape or in loops"
            elif moved.get(task):
                step += f" ({nbytes / moved[task]:.2f}x)"
            lines.append(f"  registered on {task}: {nbytes} B for {step}")
        return "\n".join(lines)

    def bytes_per_step(self):
        """``({recv task: bytes}, {recv tasks})``: the bytes one run of the instantiation moves
        into each receiving task over rdmadev (tensors of static shape outside loops), and the
        tasks that also receive tensors of run-time shape or in loops (their bytes a step are
        known only then)."""
        moved, dynamic = {}, set()
        looped = set(self.looped)
        for name, route, _, nbytes, _ in self.swapped:
            task = route.split(" -> ")[-1]
            if nbytes is None or name in looped:
                dynamic.add(task)
            else:
                moved[task] = moved.get(task, 0) + nbytes
        return moved, dynamic


def record(report):
    """Appends `report` to this process's reports."""
    with _lock:
        _reports.append(report)


def reports():
    """Reports of every instantiation planned in this process, oldest first."""
    with _lock:
        return list(_reports)
