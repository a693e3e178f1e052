"""benchmarks/scale.py's report: each configuration's figures, the checks between protocols, the
slopes per added worker, the table, the chart and the lines printed under it."""
import statistics

#: The protocols compared, in the report's order.
PROTOCOLS = ("grpc", "grpc+rdmadev")


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def _cpu(used):
    """Seconds of CPU all processes used (a cpu_used reading; NaN where none was taken)."""
    return sum(used.values()) if used else float("nan")


def _spread(xs):
    """(max - min) / median of `xs`, in percent."""
    return 100 * (max(xs) - min(xs)) / statistics.median(xs)


def summarize(runs):
    """The figures of one configuration, from its `runs` (one per cluster, --repeats): the
    median first round (and its spread across clusters), the median of every new step's and
    steady round; ps and mean worker after the rounds of the first run."""
    r = runs[0]
    after = r["after"]
    ps, ws = after["ps:0"], [v for k, v in after.items() if k.startswith("worker:")]
    rounds = [x for run in runs for x in run["rounds_s"]]
    fresh = [x for run in runs for x in run.get("fresh_first_s", [])] or [float("nan")]
    firsts = [run["first_s"] for run in runs]
    s = {"tasks": r["tasks"], "protocol": r["protocol"], "first_s": statistics.median(firsts),
         "first_runs_s": firsts, "first_spread_pct": _spread(firsts),
         "first_cpu_s": statistics.median(_cpu(run.get("first_cpu_s")) for run in runs),
         "new_first_s": statistics.median(fresh),
         "new_cpu_s": statistics.median([_cpu(c) for run in runs for c in run.get("fresh_cpu_s", [])]
                                        or [float("nan")]),
         "step_s": statistics.median(rounds),
         "spread_pct": _spread(rounds),
         "rounds": len(rounds), "start_s": r["start_s"]}
    for key in ("threads", "fds", "sockets", "memfd_maps", "memfds", "held_bytes", "rss_bytes",
                "pss_bytes", "anon_bytes"):
        s[f"ps_{key}"] = ps[key]
        s[f"worker_{key}"] = _mean([w[key] for w in ws])
    peaks = r.get("first_peak_threads", {})
    s["ps_peak_threads"] = peaks.get("ps:0", 0)
    s["worker_peak_threads"] = _mean([v for k, v in peaks.items() if k.startswith("worker:")])
    rd = r.get("rdmadev", {})
    psr = rd.get("/job:ps/replica:0/task:0", {})
    wr = [v for k, v in rd.items() if "/job:worker/" in k]
    s["ps_registered_bytes"] = psr.get("registered_bytes", 0)
    s["worker_registered_bytes"] = _mean([v.get("registered_bytes", 0) for v in wr]) if wr else 0
    s["ps_regions"] = psr.get("regions", 0)
    s["ps_py_threads"] = psr.get("py_threads", 0)
    s["ps_control_connections"] = psr.get("control_connections", {})
    s["worker_regions"] = _mean([v.get("regions", 0) for v in wr]) if wr else 0
    return s


def slope(points):
    """Least-squares slope of [(x, y)]; None with fewer than 2 distinct x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(set(xs)) < 2:
        return None
    return statistics.linear_regression(xs, ys).slope


def checks(results):
    """Per size: bitwise equal between protocols (every run of each), every update exact, and
    on rdmadev every worker's cross-task tensors swapped (none kept but those to the
    coordinator; from its first run)."""
    out = {}
    ok = [r for r in results if "error" not in r]
    by = {}
    for r in ok:
        by.setdefault((r["tasks"], r["protocol"]), r)  # a configuration's first run
    for n in sorted({t for t, _ in by}):
        g, d = by.get((n, "grpc")), by.get((n, "grpc+rdmadev"))
        if not (g and d):
            continue
        runs = [r for r in ok if r["tasks"] == n]
        reps = {t: v.get("report", {}) for t, v in d["rdmadev"].items() if "/job:worker/" in t}
        out[n] = {
            "bitwise_equal": len({(r["check"]["bits"], r["check"]["final_bits"]) for r in runs}) == 1,
            "exact_sums": all(r["exact_sum"] for r in runs),
            "workers_swapped": sum(1 for v in reps.values() if v.get("swapped")),
            "workers": n - 1,
            "kept_cross_task": sum(c for v in reps.values()
                                   for why, c in v.get("kept_reasons", {}).items()
                                   if why != "client_task"),
            "swapped": sum(v.get("swapped", 0) for v in reps.values()),
            "fabrics": sorted({f for v in reps.values() for f in v.get("fabrics", [])}),
            "retraced": sum(r["retraced"] for r in runs)}
    return out


def growth_by_name(results, protocol, role="ps"):
    """Thread names whose count on the ps (or first worker) changes from the smallest to the
    largest size measured: {name: (at smallest, at largest)}; on rdmadev also the names of
    the task's Python threads (its counters' thread_names), as "python: <name>"."""
    runs = sorted((r for r in results if r["protocol"] == protocol and "error" not in r),
                  key=lambda r: r["tasks"])
    if len(runs) < 2:
        return {}
    key = "ps:0" if role == "ps" else "worker:0"
    a, b = runs[0]["after"][key]["thread_names"], runs[-1]["after"][key]["thread_names"]
    out = {k: (a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}
    if protocol != "grpc":  # /proc names Python's threads "python": rdmadev names its own
        task = "/job:ps/replica:0/task:0" if role == "ps" else "/job:worker/replica:0/task:0"
        a, b = (r["rdmadev"][task].get("thread_names", {}) for r in (runs[0], runs[-1]))
        out.update({f"python: {k}": (a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b))
                    if a.get(k, 0) != b.get(k, 0)})
    return out


def table(summaries):
    """Markdown table: one row per size and protocol."""
    head = ("| tasks | protocol | first round s (spread) | CPU s | new step's first round s | CPU s | "
            "steady round s (spread) | ps threads (peak in first round) | "
            "worker threads | ps fds | worker fds | ps memfd maps | worker memfd maps | "
            "ps regions | ps registered / held | worker registered / held | ps / worker heap MB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in summaries:
        lines.append(
            f"| {s['tasks']} | {s['protocol']} | {s['first_s']:.2f} ({s['first_spread_pct']:.0f}%) | "
            f"{s['first_cpu_s']:.2f} | {s['new_first_s']:.2f} | {s['new_cpu_s']:.2f} | "
            f"{s['step_s']:.3f} "
            f"({s['spread_pct']:.0f}%) | {s['ps_threads']} ({s['ps_peak_threads']}) | "
            f"{s['worker_threads']:.1f} | "
            f"{s['ps_fds']} | {s['worker_fds']:.1f} | {s['ps_memfd_maps']} | "
            f"{s['worker_memfd_maps']:.1f} | {s['ps_regions']} | "
            f"{s['ps_registered_bytes'] / 1024:.1f} / {s['ps_held_bytes'] / 1024:.0f} KiB | "
            f"{s['worker_registered_bytes'] / 1024:.1f} / {s['worker_held_bytes'] / 1024:.0f} KiB | "
            f"{s['ps_anon_bytes'] / 1e6:.0f} / {s['worker_anon_bytes'] / 1e6:.0f} |")
    return "\n".join(lines)


#: (metric, role) pairs whose slope per added worker is reported.
SLOPES = [(m, role) for role in ("ps", "worker")
          for m in ("threads", "fds", "sockets", "memfd_maps", "memfds", "registered_bytes",
                    "held_bytes", "anon_bytes", "peak_threads")] + [("first_s", None), ("new_first_s", None),
                                                     ("step_s", None)]


def slopes(summaries):
    """{protocol: {metric: slope per added worker}} and rdmadev's beyond gRPC's."""
    out = {}
    for proto in PROTOCOLS:
        rows = [s for s in summaries if s["protocol"] == proto]
        out[proto] = {(f"{role}_{m}" if role else m):
                      slope([(s["tasks"] - 1, s[f"{role}_{m}" if role else m]) for s in rows])
                      for m, role in SLOPES}
    out["beyond_grpc"] = {k: (v - out["grpc"][k] if v is not None and out["grpc"][k] is not None
                              else None) for k, v in out["grpc+rdmadev"].items()}
    return out


def chart(summaries, path):
    """Threads and fds per task vs tasks (ps and mean worker, both protocols); first step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    style = {"grpc": ("tab:gray", "gRPC"), "grpc+rdmadev": ("tab:blue", "grpc+rdmadev")}
    for ax, metric, label in ((axes[0], "threads", "threads per task"),
                              (axes[1], "fds", "file descriptors per task")):
        for proto, (color, name) in style.items():
            rows = sorted((s for s in summaries if s["protocol"] == proto), key=lambda s: s["tasks"])
            xs = [s["tasks"] for s in rows]
            ax.plot(xs, [s[f"ps_{metric}"] for s in rows], "o-", color=color, label=f"{name}: ps")
            ax.plot(xs, [s[f"worker_{metric}"] for s in rows], "s--", color=color,
                    label=f"{name}: worker (mean)")
            if metric == "threads" and proto != "grpc":
                ax.plot(xs, [s["ps_peak_threads"] for s in rows], "^:", color=color,
                        label=f"{name}: ps, most during the first round")
        ax.set_title(label)
        ax.set_ylim(bottom=0)
    for proto, (color, name) in style.items():
        rows = sorted((s for s in summaries if s["protocol"] == proto), key=lambda s: s["tasks"])
        axes[2].plot([s["tasks"] for s in rows], [s["first_s"] for s in rows], "o-", color=color,
                     label=f"{name}: first round")
        axes[2].plot([s["tasks"] for s in rows], [s["new_first_s"] for s in rows], "^:", color=color,
                     label=f"{name}: a new step's first round")
        axes[2].plot([s["tasks"] for s in rows], [s["step_s"] for s in rows], "s--", color=color,
                     label=f"{name}: steady round (median)")
    axes[2].set_title("seconds per round (one step per worker)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tasks (1 ps + N-1 workers)")
        ax.set_xticks(sorted({s["tasks"] for s in summaries}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("rdmadev scale: what a task holds, 1 ps + N-1 workers on 127.0.0.1 "
                 "(benchmarks/scale.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ratios(summaries):
    """{tasks: {"first": rdmadev / gRPC, "step": ...}} where both ran."""
    by = {(s["tasks"], s["protocol"]): s for s in summaries}
    figures = {"first": "first_s", "first_cpu": "first_cpu_s", "new_first": "new_first_s",
               "new_cpu": "new_cpu_s", "step": "step_s"}
    return {n: {name: by[(n, "grpc+rdmadev")][key] / by[(n, "grpc")][key]
                for name, key in figures.items()}
            for n, p in by if p == "grpc" and (n, "grpc+rdmadev") in by}


def print_report(report):
    print(table(report["summaries"]))
    print()
    for n, c in report["checks"].items():
        rt = report["ratios"].get(n, {})
        print(f"{n} tasks: rdmadev/gRPC first round {rt.get('first', float('nan')):.2f}x (CPU "
              f"{rt.get('first_cpu', float('nan')):.2f}x), a new step's first round "
              f"{rt.get('new_first', float('nan')):.2f}x (CPU {rt.get('new_cpu', float('nan')):.2f}x), steady "
              f"{rt.get('step', float('nan')):.2f}x; bitwise equal {c['bitwise_equal']}, exact "
              f"updates {c['exact_sums']}, {c['workers_swapped']}/{c['workers']} workers swapped "
              f"{c['swapped']} transfers ({','.join(c['fabrics'])}), {c['kept_cross_task']} "
              f"cross-task kept on gRPC, retraced {c['retraced']}")
    ran = sorted({r["commit"] for r in report["runs"] if "commit" in r})  # a failed one has none
    if len(ran) > 1 or report["commit"] != report["commit_at_end"]:
        print(f"the rdmadev measured changed during the run: {report['commit']} at its start, "
              f"{report['commit_at_end']} at its end; configurations ran {', '.join(ran)}")
    sl = report["slopes"]
    for k in ("ps_threads", "ps_peak_threads", "ps_fds", "ps_memfd_maps", "ps_registered_bytes", "worker_threads",
              "worker_fds", "first_s", "new_first_s"):
        vals = [sl[p][k] for p in (*PROTOCOLS, "beyond_grpc")]
        if None not in vals:
            print(f"per added worker, {k}: gRPC {vals[0]:+.2f}, grpc+rdmadev {vals[1]:+.2f}, "
                  f"beyond gRPC {vals[2]:+.2f}")
    for proto, roles in report["thread_growth"].items():
        for role, names in roles.items():
            if names:
                print(f"{proto} {role} threads by name (smallest -> largest size): "
                      + ", ".join(f"{k} {a}->{b}" for k, (a, b) in names.items()))
    for n, why in report["skipped"].items():
        print(f"skipped {n} tasks: {why}")
    for e in report["errors"]:
        print(f"FAILED {e['tasks']} tasks {e['protocol']}: {e['error']}")
