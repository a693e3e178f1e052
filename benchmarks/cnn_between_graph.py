"""`cnn.py --between_graph`: the same models trained the way tf_cnn_benchmarks'
`--variable_update=parameter_server` mode runs them. Every worker runs its own client (a TF1
graph with the variables on the ps, its own session against its own task's master), and
applies its own gradients on the ps (asynchronous, no averaging): each task plans only its own
half of every pair, and the halves meet through the receiver (rdmadev/cluster/channels.py).

The harness starts num_ps + num_workers `rdmadev serve` tasks on 127.0.0.1 and one client
process per worker. Each client opens two sessions on the same graph: one while every task's
pass is off (`grpc`) and one while it rewrites everything (`rdmadev`, the `pass_mode` control
request, which is what RDMADEV_AUTO=1 or the grpc+rdmadev protocol sets at start). Then all
clients alternate the two by wall-clock windows (grpc, rdmadev, grpc, ...), so both variants
see the same load; a window's images/sec is the sum over workers of the images each trained
in it divided by the time it spent. Every process started here is stopped at the end.

    python benchmarks/cnn.py --between_graph --model alexnet --batch_size 8 --num_workers 2
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("grpc", "rdmadev")
#: Seconds from the harness' start signal to the first window: every client reads it, then
#: waits for the same instant.
START_DELAY_S = 2.0
#: Seconds one client may take to build its graph, open a session and run its warm-up steps
#: (TF import, graph registration on every task, a few steps of resnet50 on a loaded 2-core box).
CLIENT_SETUP_S = 600.0


def _send(proc, line):
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _expect(proc, word, timeout_s):
    """Reads `proc`'s stdout until a line starting with `word`; returns the rest of it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"a client exited before saying {word} (its stderr is above)")
        if line.startswith(word):
            return line[len(word):].strip()
    raise SystemExit(f"a client did not say {word} within {timeout_s:.0f} s")


def run(args):
    """Runs the benchmark for cnn.py's parsed `args`; returns cnn.py's result dict."""
    sys.path.insert(0, os.path.dirname(HERE))
    import rdmadev
    from graph_pass.devices import task_name
    from rdmadev.cluster import runtime
    from rdmadev.cluster.spec import parse_cluster
    from rdmadev.testing import launch

    env = {"RDMADEV_SECRET": os.environ["RDMADEV_SECRET"]}
    if args.fabric != "auto":
        env["RDMADEV_FABRIC"] = args.fabric
    t_start = time.perf_counter()
    print(f"starting {args.num_ps} ps + {args.num_workers} workers on 127.0.0.1 (rdmadev serve), "
          f"one client per worker ...", file=sys.stderr, flush=True)
    with launch.Cluster(num_ps=args.num_ps, num_workers=args.num_workers, env=env) as cluster:
        rt = runtime.current() or runtime.start(parse_cluster(cluster.spec))
        tasks = [task_name(job, i) for job, i, _ in cluster.tasks()]

        def pass_mode(auto):
            for task in tasks:
                rt.call(task, {"op": "pass_mode", "auto": auto})

        cmd = [sys.executable, os.path.abspath(__file__), "--client", json.dumps(cluster.spec),
               "--model", args.model, "--batch_size", str(args.batch_size),
               "--image_size", str(args.image_size), "--bias_op", args.bias_op,
               "--learning_rate", str(args.learning_rate),
               "--warmup", str(args.num_warmup_batches)]
        clients = [subprocess.Popen(cmd + ["--index", str(i)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
                   for i in range(args.num_workers)]
        try:
            info = json.loads(_expect(clients[0], "BUILT", CLIENT_SETUP_S))
            for variant in VARIANTS:  # each session registers its graphs under its own mode
                pass_mode(variant == "rdmadev")
                for c in clients:  # the chief first: its grpc session initializes the variables
                    _send(c, f"session {variant}")
                    _expect(c, "READY", CLIENT_SETUP_S)
                    print(f"worker {clients.index(c)}: {variant} session warm", file=sys.stderr,
                          flush=True)
            pass_mode(False)
            start = time.time() + START_DELAY_S
            for c in clients:
                _send(c, f"windows {start} {args.window_s} {2 * args.num_windows}")
            per_client = [json.loads(_expect(c, "WINDOWS", CLIENT_SETUP_S + 2 * args.num_windows
                                             * args.window_s * 4)) for c in clients]
            reports = {t: [str(r) for r in rs]
                       for t, rs in rdmadev.task_reports(cluster.spec).items()}
            grown = sum(c["grown"] for c in rdmadev.counters(cluster.spec).values()
                        if isinstance(c, dict))
        finally:
            for c in clients:
                c.kill()
                c.wait()
    rates = {v: [] for v in VARIANTS}
    for k in range(2 * args.num_windows):
        rows = [w[k] for w in per_client]
        if all(r["steps"] and r["seconds"] > 0 for r in rows):
            rates[rows[0]["variant"]].append(
                sum(args.batch_size * r["steps"] / r["seconds"] for r in rows))
    images_per_step = args.batch_size * args.num_workers
    lines = [line for rs in reports.values() for r in rs for line in r.splitlines()]
    halves = sum(bool(re.search(r" half(\+zc)? ", line)) for line in lines)
    kept = sum(line.lstrip().startswith("grpc ") for line in lines)
    return {
        "model": args.model, "batch_size": args.batch_size, "num_workers": args.num_workers,
        "num_ps": args.num_ps, "image_size": args.image_size, "fabric": args.fabric,
        "netns": False, "between_graph": True, "window_s": args.window_s,
        "variables": info["variables"], "model_bytes": info["model_bytes"],
        "num_windows": min(len(v) for v in rates.values()),
        "images_per_sec": {k: statistics.median(v) for k, v in rates.items() if v},
        "spread": {k: [min(v), max(v)] for k, v in rates.items() if v},
        "step_ms": {k: 1e3 * images_per_step / statistics.median(v) for k, v in rates.items() if v},
        "windows": rates, "halves_swapped": halves, "kept_on_grpc": kept, "grown": grown,
        "reports": reports,
        "wall_s": time.perf_counter() - t_start,
    }


# -- one worker's client (a subprocess of the harness) --

def client(spec, index, args):
    """Builds the worker's graph, then follows the harness' lines on stdin: ``session V``
    opens session V and warms it up; ``windows T0 W N`` runs N windows of W seconds from
    time T0, variant k % 2 in window k, and prints their steps and seconds."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, HERE)
    from rdmadev.tf.startup import import_tensorflow
    tf = import_tensorflow()  # without TF's start-up lines
    from models import MODELS, Params

    tf.compat.v1.disable_eager_execution()
    cluster = json.loads(spec)
    worker = f"/job:worker/replica:0/task:{index}"
    ps = [f"/job:ps/replica:0/task:{i}" for i in range(len(cluster["ps"]))]
    graph = tf.Graph()
    with graph.as_default():
        params = Params(tf, ps, args.bias_op)
        with tf.device(worker):
            images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3],
                                       seed=index + 1)
            labels = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int32,
                                       seed=index + 101)
            params.begin()
            logits = MODELS[args.model](params, images)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
            grads = tf.gradients(loss, params.order)
        applies = []
        for v, g in zip(params.order, grads):
            with tf.device(v.device):
                applies.append(v.assign_sub(args.learning_rate * g))
        train = tf.group(*applies)
        init = tf.compat.v1.global_variables_initializer()
    print("BUILT " + json.dumps({"variables": len(params.order), "model_bytes": params.nbytes}),
          flush=True)
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", worker])
    sessions = {}
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "session":
            s = sessions[rest[0]] = tf.compat.v1.Session(f"grpc://{cluster['worker'][index]}",
                                                         graph=graph, config=config)
            if index == 0 and len(sessions) == 1:
                s.run(init)
            for _ in range(args.warmup):
                s.run(train)
            print("READY", flush=True)
        elif cmd == "windows":
            t0, width, n = float(rest[0]), float(rest[1]), int(rest[2])
            out = []
            for k in range(n):
                variant = VARIANTS[k % 2]
                begin, end = t0 + k * width, t0 + (k + 1) * width
                time.sleep(max(0.0, begin - time.time()))
                steps, first = 0, time.time()
                while time.time() < end:
                    sessions[variant].run(train)
                    steps += 1
                out.append({"variant": variant, "steps": steps, "seconds": time.time() - first})
            print("WINDOWS " + json.dumps(out), flush=True)
            break
    for s in sessions.values():
        s.close()


def main():
    ap = argparse.ArgumentParser(description="one worker's client of cnn.py --between_graph")
    ap.add_argument("--client", required=True, help="the cluster spec (JSON)")
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch_size", type=int, required=True)
    ap.add_argument("--image_size", type=int, required=True)
    ap.add_argument("--bias_op", required=True)
    ap.add_argument("--learning_rate", type=float, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    args = ap.parse_args()
    client(args.client, args.index, args)


if __name__ == "__main__":
    main()
