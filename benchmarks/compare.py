"""The cnn.py matrix: images/sec of grpc vs rdmadev (and the no-network reference) per model,
batch size and worker count, as CSV, JSON, a markdown table and bar charts.

    python benchmarks/compare.py                     # the default matrix, ~10-15 min on 2 cores
    python benchmarks/compare.py --models alexnet --batch_sizes 8 16 32 --num_workers 1 2
    python benchmarks/compare.py --plot_only         # redraw from benchmarks/results/cnn_results.json
    python benchmarks/compare.py --between_graph     # a TF1 client per worker (issue 15), no reference

Each configuration is one `benchmarks/cnn.py --server_protocol both --reference` process (its
own cluster of `rdmadev serve` tasks on 127.0.0.1), in which grpc and rdmadev windows
alternate over the same variables; `--repeats` runs each configuration again (medians of the
per-run medians are reported). With `--between_graph` each configuration is one
`cnn.py --between_graph` process instead (a TF1 client per worker, as tf_cnn_benchmarks'
parameter_server mode; windows of `--window_s` seconds; no no-network reference), written to
benchmarks/results/cnn_between_graph_*. Writes benchmarks/results/cnn_results.{csv,json,md} and
cnn_<model>.png, cnn_summary.png. CPU-only with small images (32 px by default): the
weights and gradients keep their full size while the compute shrinks with the pixels, so
these runs are communication-bound, as the GPU workers of the tf_cnn_benchmarks papers were.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
#: Seconds one configuration may take (cluster start, tracing, warm-up, windows); cnn.py bounds
#: its own measurement at 900 s, so this only catches a hang.
RUN_TIMEOUT_S = 1200
#: The default matrix: the communication-bound headline (alexnet, 3 batch sizes) and every
#: model at batch 8; ~10-15 minutes on the 2-core VM.
DEFAULT = [("alexnet", 8), ("alexnet", 16), ("alexnet", 32), ("vgg16", 8), ("googlenet", 8),
           ("inception3", 8), ("resnet50", 8)]
VARIANTS = ("grpc", "rdmadev", "local")
COLORS = {"grpc": "#888888", "rdmadev": "#d62728", "local": "#1f77b4"}


def configs(args):
    if args.models is None and args.batch_sizes is None:
        pairs = DEFAULT
    else:
        models = args.models or sorted({m for m, _ in DEFAULT})
        pairs = [(m, b) for m in models for b in (args.batch_sizes or [8])]
    return [(m, b, w) for m, b in pairs for w in args.num_workers]


def run_one(args, model, batch, workers):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, os.path.join(HERE, "cnn.py"), "--model", model,
               "--batch_size", str(batch), "--num_workers", str(workers), "--num_ps", str(args.num_ps),
               "--image_size", str(args.image_size), "--num_batches", str(args.num_batches),
               "--num_windows", str(args.num_windows), "--num_warmup_batches", str(args.num_warmup_batches),
               "--fabric", args.fabric, "--no_progress", "--json", out]
        if args.between_graph:
            cmd += ["--between_graph", "--window_s", str(args.window_s)]
        else:
            cmd += (["--netns"] if args.netns else []) + ["--server_protocol", "both", "--reference"]
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = p.communicate(timeout=RUN_TIMEOUT_S)
        except BaseException:
            # SIGTERM first: cnn.py then stops its cluster (and namespaces) on the way out
            p.terminate()
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            raise
        if p.returncode != 0 or not os.path.exists(out):
            tail = "\n".join(l for l in stderr.splitlines() if "Error" in l or "error" in l)[-1500:]
            return {"error": f"exit {p.returncode}: {tail}", "cmd": " ".join(cmd)}
        with open(out) as f:
            r = json.load(f)
        r["run_s"] = time.perf_counter() - t0
        return r


def aggregate(model, batch, workers, runs):
    ok = [r for r in runs if "error" not in r]
    row = {"model": model, "batch_size": batch, "num_workers": workers, "runs": len(ok)}
    if not ok:
        row["error"] = runs[-1].get("error", "?") if runs else "not run"
        return row
    for v in VARIANTS:
        vals = [r["images_per_sec"][v] for r in ok if v in r["images_per_sec"]]
        row[v] = statistics.median(vals) if vals else None
    first = ok[0]
    row.update({"num_ps": first["num_ps"], "image_size": first["image_size"],
                "model_MiB": first["model_bytes"] / 2**20, "variables": first["variables"],
                "windows": first["num_windows"], "batches": first.get("num_batches")})
    if row.get("grpc") and row.get("rdmadev"):
        row["speedup"] = row["rdmadev"] / row["grpc"]
        # per-window ratios of the same run, the noise band of the speedup
        ratios = [a / b for r in ok for a, b in zip(r["windows"]["rdmadev"], r["windows"]["grpc"])]
        row["speedup_min"], row["speedup_max"] = min(ratios), max(ratios)
    if row.get("local") and row.get("rdmadev"):
        row["rdmadev_of_local"] = row["rdmadev"] / row["local"]
    rep = first.get("report") or {}
    row["swapped"], row["kept"] = rep.get("swapped"), rep.get("kept")
    if first.get("between_graph"):  # every task's halves (cnn_between_graph.py)
        row["swapped"], row["kept"] = first["halves_swapped"], first["kept_on_grpc"]
        row["grown"] = first.get("grown")
    row["swapped_MiB_per_step"] = (rep.get("swapped_bytes_per_step") or 0) / 2**20
    row["fabrics"] = ",".join(rep.get("fabrics", []))
    return row


def markdown(rows):
    head = ("| model | batch/worker | workers | MiB of variables | grpc img/s | rdmadev img/s | speedup "
            "(window range) | no-network img/s | rdmadev / no-network | swapped (MiB/step) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch_size']} | {r['num_workers']} | | failed: "
                         f"{r['error'][:120]} | | | | | |")
            continue
        sp = (f"**{r['speedup']:.2f}x** ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
              if r.get("speedup") else "-")
        local = f"{r['local']:.1f}" if r.get("local") else "-"
        of_local = f"{r['rdmadev_of_local']:.2f}" if r.get("rdmadev_of_local") else "-"
        moved = (f"{r['swapped']} ({r['swapped_MiB_per_step']:.0f}, {r['fabrics']})"
                 if r["fabrics"] else
                 f"{r['swapped']} halves, {r['kept']} on gRPC, {r['grown']} grown")
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['num_workers']} | {r['model_MiB']:.0f} | "
            f"{r['grpc']:.1f} | {r['rdmadev']:.1f} | {sp} | {local} | {of_local} | {moved} |")
    return "\n".join(lines) + "\n"


def plot(rows, image_size, prefix, netns=False):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [r for r in rows if "error" not in r]
    written = []
    groups = {}
    for r in good:
        groups.setdefault((r["model"], r["num_workers"]), []).append(r)
    variants = [v for v in VARIANTS if any(r.get(v) for r in good)]  # no local: between-graph
    where = "one netns per task, tcp fabric over veth" if netns else "127.0.0.1, shm fabric"
    how = "" if "local" in variants else ", a TF1 client per worker"
    note = (f"{where}; CPU-only, {image_size}px synthetic images: communication-bound "
            f"(see BENCHMARKS.md)")

    def bars(ax, items, labels):
        width = 0.27
        for j, v in enumerate(variants):
            xs = [i + (j - (len(variants) - 1) / 2) * width for i in range(len(items))]
            ys = [r.get(v) or 0 for r in items]
            name = "no network (vars on worker)" if v == "local" else v
            ax.bar(xs, ys, width, label=name, color=COLORS[v])
            if v == "rdmadev":
                for x, y, r in zip(xs, ys, items):
                    if r.get("speedup"):
                        ax.annotate(f"{r['speedup']:.2f}x", (x, y), ha="center", va="bottom",
                                    fontsize=9, fontweight="bold")
        ax.set_xticks(range(len(items)))
        ax.set_xticklabels(labels)
        ax.set_ylabel("images/sec")
        ax.legend(fontsize=8)

    for (model, workers), items in sorted(groups.items()):
        items.sort(key=lambda r: r["batch_size"])
        fig, ax = plt.subplots(figsize=(6.5, 4))
        bars(ax, items, [f"batch {r['batch_size']}" for r in items])
        ax.set_title(f"{model}, 1 ps + {workers} workers{how}: grpc vs rdmadev (speedup "
                     "labelled)", fontsize=9 if how else 10)
        fig.text(0.5, 0.01, note, ha="center", fontsize=7)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        path = f"{prefix}{model}_w{workers}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    summary = sorted((r for r in good if r["batch_size"] == min(x["batch_size"] for x in good)),
                     key=lambda r: (r["num_workers"], r["model"]))
    if summary:
        fig, ax = plt.subplots(figsize=(8, 4))
        bars(ax, summary, [f"{r['model']}\n{r['num_workers']}w" for r in summary])
        ax.set_yscale("log")
        ax.set_title(f"every model, batch {summary[0]['batch_size']} per worker{how}: grpc vs "
                     f"rdmadev (speedup labelled)", fontsize=10)
        fig.text(0.5, 0.01, note, ha="center", fontsize=7)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        path = f"{prefix}summary.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write(rows, meta, prefix):
    with open(prefix + "results.json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    keys = ["model", "batch_size", "num_workers", "num_ps", "image_size", "model_MiB", "grpc", "rdmadev",
            "local", "speedup", "speedup_min", "speedup_max", "rdmadev_of_local", "swapped", "kept",
            "swapped_MiB_per_step", "fabrics", "grown", "runs", "windows", "batches", "error"]
    with open(prefix + "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with open(prefix + "results.md", "w") as f:
        f.write(markdown(rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+")
    ap.add_argument("--batch_sizes", nargs="+", type=int)
    ap.add_argument("--num_workers", nargs="+", type=int, default=[2])
    ap.add_argument("--num_ps", type=int, default=1)
    ap.add_argument("--image_size", type=int, default=32)
    ap.add_argument("--num_batches", type=int, default=15)
    ap.add_argument("--num_windows", type=int, default=5)
    ap.add_argument("--num_warmup_batches", type=int, default=2)
    ap.add_argument("--fabric", default="auto", choices=["auto", "shm", "tcp"])
    ap.add_argument("--netns", action="store_true", help="pass --netns to cnn.py (tcp fabric over veth)")
    ap.add_argument("--between_graph", action="store_true",
                    help="run cnn.py --between_graph (a TF1 client per worker; no reference)")
    ap.add_argument("--window_s", type=float, default=10.0,
                    help="--between_graph: seconds of each measurement window")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--prefix", help="output path prefix (default benchmarks/results/cnn_, "
                                     "with --between_graph cnn_between_graph_)")
    ap.add_argument("--plot_only", action="store_true")
    args = ap.parse_args(argv)
    if args.between_graph and args.netns:
        ap.error("--between_graph runs on 127.0.0.1 only (cnn.py)")
    if args.prefix is None:
        args.prefix = os.path.join(RESULTS, "cnn_between_graph_" if args.between_graph else "cnn_")
    os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)
    if args.plot_only:
        with open(args.prefix + "results.json") as f:
            data = json.load(f)
        print("\n".join(plot(data["rows"], data["meta"]["image_size"], args.prefix,
                              data["meta"].get("netns", False))))
        return 0
    matrix = configs(args)
    meta = {k: getattr(args, k) for k in ("num_ps", "image_size", "num_batches", "num_windows",
                                          "num_warmup_batches", "fabric", "repeats", "netns",
                                          "between_graph", "window_s")}
    meta.update({"host": os.uname().nodename, "cpus": os.cpu_count(),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    runs = {c: [] for c in matrix}
    t0 = time.perf_counter()
    for rep in range(args.repeats):  # repeats go round the whole matrix: drift hits every config
        for i, (model, batch, workers) in enumerate(matrix):
            try:
                r = run_one(args, model, batch, workers)
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {RUN_TIMEOUT_S} s"}
            runs[(model, batch, workers)].append(r)
            if "error" in r:
                msg = f"FAILED: {r['error'][:300]}"
            else:
                ips = r["images_per_sec"]
                local = f"  local {ips['local']:.1f}" if "local" in ips else ""
                msg = (f"grpc {ips['grpc']:.1f}  rdmadev {ips['rdmadev']:.1f} "
                       f"({ips['rdmadev'] / ips['grpc']:.2f}x){local}  [{r['run_s']:.0f} s]")
            print(f"[{rep + 1}/{args.repeats} {i + 1}/{len(matrix)} {time.perf_counter() - t0:6.0f} s] "
                  f"{model} batch {batch} x {workers} workers: {msg}", flush=True)
    rows = [aggregate(m, b, w, runs[(m, b, w)]) for m, b, w in matrix]
    meta["wall_s"] = time.perf_counter() - t0
    write(rows, meta, args.prefix)
    print(markdown(rows))
    for path in plot(rows, args.image_size, args.prefix, args.netns):
        print("wrote", path)
    print(f"wrote {args.prefix}results.csv / .json / .md")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
