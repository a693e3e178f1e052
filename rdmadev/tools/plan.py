"""``rdmadev plan``: show what rdmadev would swap, without changing anything.

Usage (``rdmadev plan ...`` dispatches here, to ``main``; ``python -m rdmadev.tools.plan ...`` too)::

    rdmadev plan train.py:step --cluster cluster.json --out plan.png
    rdmadev plan --run-metadata step.runmeta --json plan.json
    rdmadev plan --graphdef ps.pb worker0.pb

``FILE.py:FUNC`` imports the file and calls ``FUNC()`` (no arguments) ONCE with TF run metadata
on, so the step runs once with its side effects; nothing is rewritten. With ``--cluster`` (a JSON
cluster spec, or ``@file``) or ``TF_CONFIG``'s ``cluster``, this process connects as the
coordinator first; otherwise the script connects itself. Every instantiation with cross-task
transfers is planned, printed as a table and, with ``--out``, drawn.

Shapes come from TF's own shape functions: before planning, each instantiation's partitions go
through ``rdmadev.tools.tf_shapes.annotate``, the native pass's own shape code (TF's ShapeRefiner
across the partitions, bounds of run-time shapes included) run through rdmadev's op library,
so the plan is the one the pass would make, with the pass's own rules and slot layout
(``rdmadev._core.PLANNER_RULES``). Without an importable TensorFlow or a built op library
(``--run-metadata``/``--graphdef`` only), shapes are what the graphs carry.

Exit codes: 0 planned, 1 planning or running failed (the message says why), 2 bad usage.
"""

import argparse
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

from graph_pass.errors import GraphPassError
from graph_pass.explain import explain
from graph_pass.load import as_graph_def, partition_sets
from graph_pass.pipeline import plan_partitions
from graph_pass.plan import CARRIES, Config

from .._core import PLANNER_RULES

__all__ = ["main", "build_parser"]

log = logging.getLogger(__name__)
log.addHandler(logging.NullHandler())


def build_parser(prog="rdmadev plan"):
    """Return the argparse parser of ``rdmadev plan``."""
    p = argparse.ArgumentParser(prog=prog, description="Plan rdmadev's swaps for a TF step and explain them "
                                "(a table, a picture); nothing is rewritten.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("target", nargs="?", help="FILE.py:FUNC - run FUNC() once with run metadata and plan it")
    src.add_argument("--run-metadata", metavar="FILE", help="a serialized RunMetadata (export_run_metadata())")
    src.add_argument("--graphdef", metavar="FILE", nargs="+", help="serialized partition GraphDefs of one "
                     "instantiation")
    p.add_argument("--cluster", help="cluster spec JSON or @file to connect to first (default: TF_CONFIG's)")
    p.add_argument("--out", metavar="PATH", help="draw the plan to PATH (.png/.svg); several instantiations "
                   "get -1, -2, ... before the suffix")
    p.add_argument("--json", metavar="PATH", help="write the plan(s) as JSON (a list of plans)")
    p.add_argument("--slots", type=int, default=Config.slots,
                   help="slots of every channel (default: 1 per static channel, 2 per dynamic one)")
    p.add_argument("--min-bytes", type=int, default=0, help="keep static tensors below this size on gRPC")
    p.add_argument("--plan-client-pairs", action="store_true", help="also plan pairs to/from the client task")
    p.add_argument("--default-dynamic-capacity", type=int, help="bytes bound for dynamic-shape transfers")
    p.add_argument("--half-pair-capacity", type=int, help="capacity for pairs with one half planned (TF1)")
    p.add_argument("--zero-copy-min-bytes", type=int, default=Config.zero_copy_min_bytes,
                   help="smallest transfer the receiver may alias (default %(default)s)")
    p.add_argument("--deadline-s", type=float, default=Config.deadline_s,
                   help="seconds every wait of a planned channel may take (default %(default)s)")
    p.add_argument("--bundle-below-bytes", type=int, default=Config.bundle_below_bytes,
                   help="static tensors below this share a channel with the other small ones of their step "
                        "between the same two devices; 0: none (default %(default)s)")
    p.add_argument("--carry", action="append", default=[], choices=CARRIES,
                   help="plan as if the ops could carry this too (repeatable; default: static shapes, both halves)")
    p.add_argument("--instance-id", default="plan", help="instance id in channel keys (default %(default)r)")
    return p


class _UsageError(Exception):
    """Bad command-line input (exit code 2)."""


def _cluster_spec(arg):
    if arg:
        text = Path(arg[1:]).read_text() if arg.startswith("@") else arg
        return json.loads(text)
    tf_config = os.environ.get("TF_CONFIG")
    return json.loads(tf_config).get("cluster") if tf_config else None


def _run_target(target, cluster):
    path, sep, func = target.rpartition(":")
    if not sep or not path.endswith(".py") or not func:
        raise _UsageError(f"target {target!r} must be FILE.py:FUNC")
    if not Path(path).is_file():
        raise _UsageError(f"no such file {path!r}")
    import tensorflow as tf
    from tensorflow.python.eager import context

    if cluster:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster))
    ctx = context.context()
    ctx.enable_run_metadata()  # before the module is imported: it may call the function itself
    try:
        spec = importlib.util.spec_from_file_location("_rdmadev_plan_target", path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(Path(path).resolve().parent))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
        fn = getattr(module, func, None)
        if not callable(fn):
            raise _UsageError(f"{path} has no callable {func!r}")
        try:
            fn()
        except Exception as exc:  # the user's step failed: say so, with TF's message
            raise RuntimeError(f"running {target} failed: {type(exc).__name__}: {exc}") from exc
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    return partition_sets(metadata)


def _tf_shapes(sets):
    """Each partition set with TF's inferred shapes on its `_Recv` nodes (unchanged without TF)."""
    try:
        from .tf_shapes import annotate, library
        import tensorflow  # noqa: F401
        library()  # loads rdmadev's op library
    except ImportError as exc:
        print(f"rdmadev plan: TensorFlow is not importable ({exc}); shapes are only what the graphs carry",
              file=sys.stderr)
        return sets
    except (OSError, ValueError) as exc:  # rdmadev's ConfigError: not built, or for another TF
        print(f"rdmadev plan: rdmadev's op library cannot be loaded ({exc}); shapes are only what the "
              f"graphs carry", file=sys.stderr)
        return sets
    return [annotate(s) for s in sets]


def _numbered(path, i, n):
    if n == 1:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{i}{p.suffix}"))


def main(argv=None):
    """Run ``rdmadev plan``.

    Args:
        argv: arguments after ``plan`` (default ``sys.argv[1:]``).

    Returns:
        The exit code (0 planned, 1 failure, 2 usage).
    """
    args = build_parser().parse_args(argv)
    try:
        config = Config(slots=args.slots, min_bytes=args.min_bytes, plan_client_pairs=args.plan_client_pairs,
                        default_dynamic_capacity=args.default_dynamic_capacity,
                        half_pair_capacity=args.half_pair_capacity,
                        zero_copy_min_bytes=args.zero_copy_min_bytes, deadline_s=args.deadline_s,
                        bundle_below_bytes=args.bundle_below_bytes, carries={k: k in args.carry for k in CARRIES})
        if args.graphdef:
            sets = [[as_graph_def(Path(f).read_bytes(), f) for f in args.graphdef]]
        elif args.run_metadata:
            sets = partition_sets(Path(args.run_metadata).read_bytes())
        else:
            sets = _run_target(args.target, _cluster_spec(args.cluster))
        sets = _tf_shapes(sets)
        plans = [p for p in (plan_partitions(s, config, args.instance_id, rules=PLANNER_RULES) for s in sets)
                 if p.transfers]
    except _UsageError as exc:
        print(f"rdmadev plan: {exc}", file=sys.stderr)
        return 2
    except (GraphPassError, OSError, ValueError, RuntimeError) as exc:
        print(f"rdmadev plan: {exc}", file=sys.stderr)
        return 1
    if not plans:
        print(f"no cross-task transfers in {len(sets)} instantiation(s): nothing to swap")
    for i, plan in enumerate(plans, 1):
        if len(plans) > 1:
            print(f"== instantiation {i} of {len(plans)}")
        out = _numbered(args.out, i, len(plans)) if args.out else None
        print(explain(plan, out))
        if out:
            print(f"picture: {out}")
    if args.json:
        Path(args.json).write_text(json.dumps([p.to_dict() for p in plans], indent=1, sort_keys=True))
        print(f"plan JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
