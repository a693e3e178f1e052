"""Pass 5, explain: a plan as a text table and as a picture (PNG, SVG or PDF, chosen by extension).

The picture draws tasks as boxes (with the bytes each registers) and, per ordered task pair, one
arrow for the swapped transfers (solid, highlighted, with their count and bytes per step) and one
for those kept on gRPC (dashed, with their reasons). matplotlib is imported only when a picture is
asked for, through its object API (no pyplot, no global backend change).
"""

import logging
import math
from collections import Counter, defaultdict

from .bundles import BUNDLE_ID_SHOWN
from .devices import parse_device
from .plan import DYNAMIC_SLOTS, STATIC_SLOTS

__all__ = ["explain", "format_table", "draw", "build_figure", "short_task", "human_bytes"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())

#: Widest transfer label in the table; longer node names keep their tail (the most specific part).
LABEL_WIDTH = 44
#: Arc of the task-pair arrows (matplotlib arc3 rad): opposite directions bend apart and don't overlap.
ARROW_RAD = 0.25
#: Points cut from each arrow end so arrowheads stop outside the task boxes (about half a box width).
SHRINK_PT = 50
#: Colours: swapped edges highlighted, kept edges muted.
SWAP_COLOR, KEEP_COLOR, TASK_COLOR = "#1a9850", "#878787", "#deebf7"


def short_task(task):
    """``/job:worker/replica:0/task:1`` -> ``worker:1`` (replica shown only when not 0; ``?`` for no job).

    Raises:
        ValueError: ``task`` is not a task or device name.
    """
    d = parse_device(task)
    if not d.job:
        return "?"
    return f"{d.job}:{'' if d.replica == 0 else f'r{d.replica}:'}{d.task}"


def human_bytes(n):
    """Format a byte count: ``1536 -> "1.5 KiB"``; None -> ``"?"``."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _clip(text, width):
    return text if len(text) <= width else "…" + text[-(width - 1):]


def format_table(plan):
    """Return the plan as a text table plus a summary.

    Args:
        plan: a ``Plan``.

    Returns:
        A multi-line string: one row per transfer (transfer, from -> to, kind, dtype, shape, bytes,
        decision, reason, region, offset; a run-time shape as ``?`` dims, or ``<=[...]`` within
        its bound; a bundle's member as ``static bundle <id>`` at its channel's offset ``+`` its
        own in the payload), then totals per decision and per receiving task.
    """
    head = ("transfer", "from -> to", "kind", "dtype", "shape", "bytes", "decision", "reason", "region", "offset")
    rows = []
    for t in plan.transfers:
        shape = "?" if t.shape is None else "[" + ",".join("?" if d < 0 else str(d) for d in t.shape) + "]"
        if t.bound is not None:  # a run-time shape within a bound TF's shapes give
            shape = "<=[" + ",".join(map(str, t.bound)) + "]"
        size = t.bytes if t.bytes is not None else (f"<={t.capacity_bytes}" if t.capacity_bytes else "?")
        region = "" if t.region is None else f"{short_task(t.recv_task)}<-{short_task(t.send_task)}"
        rows.append((_clip(t.label, LABEL_WIDTH), f"{short_task(t.send_task)} -> {short_task(t.recv_task)}",
                     t.kind, t.dtype.replace("DT_", "").lower(), shape, str(size), t.decision or "-",
                     (t.reason or "-") + (f" bundle {t.bundle[:BUNDLE_ID_SHOWN]}" if t.bundle else "")
                     + (" via host" if t.via_host and t.decision == "swap" else ""), region,
                     "" if t.task_offset is None else str(t.task_offset) +
                     (f"+{t.bundle_offset}" if t.bundle else "")))
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'>' if i in (5, 9) else '<'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]
    swapped = plan.swapped()
    per_step = sum(t.bytes or 0 for t in swapped)
    reasons = Counter(t.reason for t in plan.kept())
    lines.append("")
    lines.append(f"{len(plan.transfers)} cross-task transfers: {len(swapped)} swapped ({human_bytes(per_step)} per "
                 f"step), {len(plan.kept())} kept on gRPC"
                 + (" (" + ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())) + ")" if reasons else ""))
    cfg = plan.config
    carried = [k for k, v in sorted(cfg.carries.items()) if v]
    slots = (f"{cfg.slots} slots" if cfg.slots is not None
             else f"{STATIC_SLOTS} slot per static channel, {DYNAMIC_SLOTS} per dynamic one")
    lines.append(f"  config: {slots}, zero-copy from {human_bytes(cfg.zero_copy_min_bytes)}, deadline "
                 f"{cfg.deadline_s:g} s, bundles below {human_bytes(cfg.bundle_below_bytes)}, ops carry "
                 f"static shapes{''.join(' + ' + k for k in carried)}")
    bundles = Counter(t.bundle for t in swapped if t.bundle)
    if bundles:
        lines.append(f"  {sum(bundles.values())} small tensors share {len(bundles)} bundle(s): "
                     f"{len({t.channel_key for t in swapped})} channels for {len(swapped)} swapped transfers")
    hosted = [t for t in swapped if t.via_host]
    if hosted:
        lines.append(f"  {len(hosted)} swapped with an end on a device other than its task's CPU cross via host: "
                     f"{sum(t.via_host for t in hosted)} device copies per step "
                     f"({human_bytes(sum(t.via_host * (t.bytes or 0) for t in hosted))} of static shape)")
    for b in plan.tasks:
        lines.append(f"  {short_task(b.task)} registers {human_bytes(b.total_bytes)} ({b.total_bytes} B) in "
                     f"{len(b.regions)} region(s)")
    if plan.instance_id:
        lines.append(f"  instance id {plan.instance_id}")
    return "\n".join(lines)


def _positions(tasks):
    n = len(tasks)
    if n == 1:
        return {tasks[0]: (0.0, 0.0)}
    return {t: (math.cos(math.pi / 2 + 2 * math.pi * i / n), math.sin(math.pi / 2 + 2 * math.pi * i / n))
            for i, t in enumerate(tasks)}


def build_figure(plan, title=None):
    """Return a matplotlib ``Figure`` of the plan (tasks as boxes, one arrow per task pair and kind).

    Args:
        plan: a ``Plan``.
        title: optional title (default: a one-line summary).

    Returns:
        The Figure; its single Axes holds the task boxes (texts) and arrows (FancyArrowPatch).
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch

    tasks = sorted({t.send_task for t in plan.transfers} | {t.recv_task for t in plan.transfers}
                   | {b.task for b in plan.tasks})
    pos = _positions(tasks)
    registered = {b.task: b.total_bytes for b in plan.tasks}
    edges = defaultdict(lambda: {"swap": [], "keep": []})
    for t in plan.transfers:
        edges[(t.send_task, t.recv_task)]["swap" if t.decision == "swap" else "keep"].append(t)
    fig = Figure(figsize=(9, 8))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xlim(-1.7, 1.7)
    ax.set_ylim(-1.6, 1.6)
    ax.set_aspect("equal")
    ax.axis("off")
    for (src, dst), groups in sorted(edges.items()):
        (x1, y1), (x2, y2) = pos[src], pos[dst]
        for i, (kind, items) in enumerate((k, v) for k, v in groups.items() if v):
            rad = ARROW_RAD * (1 + 0.9 * i)
            swap = kind == "swap"
            width = 1.5 + (min(4.0, math.log10(1 + sum(t.bytes or 0 for t in items))) if swap else 0)
            ax.add_patch(FancyArrowPatch((x1, y1), (x2, y2), connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
                                         mutation_scale=18, lw=width, color=SWAP_COLOR if swap else KEEP_COLOR,
                                         linestyle="-" if swap else "--", shrinkA=SHRINK_PT, shrinkB=SHRINK_PT, zorder=1))
            mx, my = (x1 + x2) / 2 + 0.5 * rad * (y2 - y1), (y1 + y2) / 2 - 0.5 * rad * (x2 - x1)
            if swap:
                label = f"{len(items)} swapped\n{human_bytes(sum(t.bytes or 0 for t in items))}/step"
            else:
                label = "kept on gRPC:\n" + "\n".join(f"{n} {r}" for r, n in sorted(Counter(
                    t.reason for t in items).items()))
            ax.text(mx, my, label, fontsize=7.5, ha="center", va="center", color=SWAP_COLOR if swap else "#4d4d4d",
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}, zorder=3)
    for task, (x, y) in pos.items():
        ax.text(x, y, f"{short_task(task)}\nregisters {human_bytes(registered.get(task, 0))}", ha="center",
                va="center", fontsize=10, zorder=4,
                bbox={"boxstyle": "round,pad=0.6", "fc": TASK_COLOR, "ec": "#2171b5", "lw": 1.5})
    ax.set_title(title or f"rdmadev plan: {len(plan.swapped())} swapped (green), {len(plan.kept())} kept on gRPC "
                          f"(grey, dashed)", fontsize=11)
    return fig


def draw(plan, path, title=None):
    """Draw the plan to ``path`` (format from its extension: .png, .svg, .pdf).

    Args:
        plan: a ``Plan``.
        path: output file path.
        title: optional title (default: a one-line summary).

    Returns:
        ``path``.
    """
    build_figure(plan, title).savefig(path, dpi=110, bbox_inches="tight")
    log.debug("drew plan to %s", path)
    return path


def explain(plan, path=None, title=None):
    """Explain a plan: return its text table and, when ``path`` is given, draw its picture there.

    Args:
        plan: a ``Plan``.
        path: optional picture path (.png, .svg or .pdf).
        title: optional picture title.

    Returns:
        The text table (``format_table(plan)``).

    Example:
        >>> print(explain(plan, "plan.png"))  # doctest: +SKIP
    """
    text = format_table(plan)
    if path is not None:
        draw(plan, path, title)
    return text
