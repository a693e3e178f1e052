"""The matrix of benchmarks/pss.py: every configuration (1 and 2 workers; loopback with the
shm fabric, --netns with the tcp fabric) in its own `pss.py --one` process (TF keeps one
cluster per process), then one table, its notes, a chart and the raw data.

    python benchmarks/pss.py                                   # runs this (see pss.py)
    python benchmarks/pss.py --windows 15 --append_md docs/history/pss.md

Writes <prefix>results.json (every run's result), <prefix>results.md (the table) and
<prefix[:-1]>.png; --append_md appends the table with the command and date to a file.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from pss import VARIANTS, spread

__all__ = ["run_matrix"]

HERE = os.path.dirname(os.path.abspath(__file__))
#: Seconds one configuration process may take (start, trace, warm-up, check, windows: 1-3
#: minutes here); only catches a hang.
RUN_TIMEOUT_S = 1200
#: The arguments every configuration process gets from the matrix's own.
PASSED = ("features", "hidden", "layers", "classes", "batch", "optimizer", "steps", "windows",
          "warmup", "check_steps", "route", "inter_op")


def run_config(args, workers, mode):
    """One configuration in its own process (TF keeps one cluster per process)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, os.path.join(HERE, "pss.py"), "--one", "--num_workers", str(workers),
               "--json", out, "--no_progress"] + (["--netns"] if mode == "netns" else [])
        for k in PASSED:
            cmd += [f"--{k}", str(getattr(args, k))]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = p.communicate(timeout=RUN_TIMEOUT_S)
        except BaseException:
            p.terminate()  # SIGTERM: the child stops its cluster (and namespaces) on the way out
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            raise
        if p.returncode != 0 or not os.path.exists(out):
            tail = [l for l in stderr.splitlines() if "rror" in l or "xit" in l][-5:]
            return {"num_workers": workers, "netns": mode == "netns",
                    "error": f"exit {p.returncode}: " + " | ".join(tail)[-800:]}
        sys.stdout.write(stdout)
        with open(out) as f:
            return json.load(f)


def rows_of(results):
    """Table rows: one per (configuration, variant)."""
    rows = []
    for r in results:
        where = "tcp (netns)" if r.get("netns") else "shm (loopback)"
        if "error" in r:
            rows.append({"workers": r["num_workers"], "fabric": where, "variant": "-",
                         "error": r["error"]})
            continue
        g = r["windows"]["grpc"]
        for name in VARIANTS:
            w = r["windows"][name]
            ratios = [a / b for a, b in zip(w, g)]
            rows.append({"workers": r["num_workers"], "fabric": where, "variant": name,
                         "steps_per_sec": statistics.median(w), "min": min(w), "max": max(w),
                         "spread_pct": spread(w),
                         "ratio": statistics.median(w) / statistics.median(g),
                         "ratio_min": min(ratios), "ratio_max": max(ratios)})
    return rows


def markdown(rows):
    lines = ["| variant | workers | fabric | steps/s (median) | spread: min-max (% of median) "
             "| x gRPC (per-window range) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| - | {r['workers']} | {r['fabric']} | failed: {r['error'][:150]} | | |")
            continue
        ratio = ("1.00" if r["variant"] == "grpc" else
                 f"**{r['ratio']:.2f}x** ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})")
        name = "no-network" if r["variant"] == "local" else r["variant"]
        lines.append(f"| {name} | {r['workers']} | {r['fabric']} | {r['steps_per_sec']:.2f} | "
                     f"{r['min']:.2f}-{r['max']:.2f} ({r['spread_pct']:.0f}%) | {ratio} |")
    return "\n".join(lines) + "\n"


def notes(results):
    """Below the table: what crossed per step, the bitwise checks, re-instantiations."""
    out = []
    for r in results:
        if "error" in r:
            continue
        rep, check = r["report"], r["check"]
        where = "tcp (netns)" if r["netns"] else "shm (loopback)"
        out.append(f"- {r['num_workers']} worker(s), {where}: rdmadev swapped {rep['swapped']} "
                   f"transfers ({rep['swapped_bytes'] / 2**20:.1f} MiB per step, "
                   f"{', '.join(rep['fabrics'])}), {rep['kept']} stayed on gRPC; "
                   f"{r['instantiations_during_windows']} instantiations and "
                   f"{sum(r['retraced_during_windows'].values())} retraces during the windows"
                   + (f"; {check['steps']} steps bitwise identical to gRPC: "
                      f"{'yes' if check['identical'] else 'NO'}" if check else ""))
    return "\n".join(out) + "\n"


def plot(rows, path, note):
    """Bars of steps/s per configuration and variant, the ratio to gRPC written on top."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = []
    for r in rows:
        if "error" not in r and (r["workers"], r["fabric"]) not in configs:
            configs.append((r["workers"], r["fabric"]))
    colors = {"grpc": "#888888", "rdmadev": "#d62728", "local": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.27
    for j, name in enumerate(VARIANTS):
        for i, c in enumerate(configs):
            r = next(x for x in rows if "error" not in x and (x["workers"], x["fabric"]) == c
                     and x["variant"] == name)
            x = i + (j - 1) * width
            ax.bar(x, r["steps_per_sec"], width, color=colors[name],
                   yerr=[[r["steps_per_sec"] - r["min"]], [r["max"] - r["steps_per_sec"]]],
                   capsize=2, label=("no network (vars on worker)" if name == "local" else name)
                   if i == 0 else None)
            ax.annotate(f"{r['ratio']:.2f}x", (x, r["max"]), ha="center", va="bottom", fontsize=8,
                        fontweight="bold" if name == "rdmadev" else "normal")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([f"{w} worker{'s' if w > 1 else ''}\n{f}" for w, f in configs])
    ax.set_ylabel("steps/sec (median; bars: min-max of windows)")
    ax.set_title("ParameterServerStrategy, 1 ps: gRPC vs rdmadev vs no network (x gRPC on top)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.5, 0.01, "\n".join(textwrap.wrap(note, 120)), ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_matrix(args):
    if "netns" in args.modes:
        import cnn_netns
        why = cnn_netns.unavailable_reason()
        if why:
            print(f"skipping --netns configurations: {why}", file=sys.stderr)
            args.modes = [m for m in args.modes if m != "netns"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    results = []
    for mode in args.modes:
        for workers in args.workers:
            print(f"[{time.perf_counter() - t0:5.0f} s] {workers} worker(s), {mode} ...",
                  file=sys.stderr, flush=True)
            try:
                results.append(run_config(args, workers, mode))
            except subprocess.TimeoutExpired:
                results.append({"num_workers": workers, "netns": mode == "netns",
                                "error": f"timed out after {RUN_TIMEOUT_S} s"})
    rows = rows_of(results)
    ok = [r for r in results if "error" not in r]
    c = args
    model = (f"Dense {c.features}-{'-'.join([str(c.hidden)] * c.layers)}-{c.classes}, "
             f"{ok[0]['model_bytes'] / 2**20:.1f} MiB of weights, " if ok else "")
    head = (f"{model}batch {c.batch}/worker, {c.optimizer}; median of {c.windows} windows of "
            f"{c.steps} steps per variant, alternating; route {c.route}")
    table = markdown(rows) + "\n" + notes(results)
    print(head)
    print(table)
    os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)
    meta = {"started": started, "command": " ".join(["python", "benchmarks/pss.py"] + sys.argv[1:]),
            "host": os.uname().nodename, "cpus": os.cpu_count(), "head": head,
            "wall_s": time.perf_counter() - t0}
    with open(args.prefix + "results.json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "runs": results}, f, indent=1)
    with open(args.prefix + "results.md", "w") as f:
        f.write(head + "\n\n" + table)
    if rows and any("error" not in r for r in rows):
        try:
            print("wrote", plot(rows, args.prefix.rstrip("_") + ".png",
                                f"{head}; {started}"))
        except ImportError:
            print("matplotlib is not installed: no chart", file=sys.stderr)
    if args.append_md:
        with open(args.append_md, "a") as f:
            f.write(f"\nRun of {started} (`{meta['command']}`, {meta['wall_s'] / 60:.0f} min):"
                    f" {head}.\n\n{table}")
    return 0 if all("error" not in r for r in results) else 1
