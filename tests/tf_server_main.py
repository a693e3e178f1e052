"""One TensorFlow task of a loopback test cluster: ``python tf_server_main.py --cluster JSON --job J --index I``.

Started by ``tests/tf_cluster.py`` (one process per task): a plain TF server, without rdmadev
(tasks that run rdmadev use ``rdmadev serve``). It starts a ``tf.distribute.Server`` on the address
the cluster spec gives this task, prints a ready line and serves until it is killed.

Exit codes: 0 never (it serves until killed), 2 on bad arguments.
"""

import argparse
import os
import sys

from rdmadev.cluster.spec import parse_cluster

#: Line printed (and flushed) once the server is listening; the cluster helper's log shows it.
READY_MARKER = "TF_SERVER_READY"


def main(argv=None):
    """Parse arguments, start one ``tf.distribute.Server`` and block in ``join()``.

    Args:
        argv: command-line arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        Never returns normally; the process is terminated by the cluster helper.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True, help="cluster spec as JSON: {job: [host:port, ...]}")
    parser.add_argument("--job", required=True, help="this task's job name, e.g. ps or worker")
    parser.add_argument("--index", required=True, type=int, help="this task's index in its job")
    args = parser.parse_args(argv)
    spec = parse_cluster(args.cluster)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # imported late: argument errors should not pay TF's import time
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=args.job, task_index=args.index,
                                  protocol="grpc", start=True)
    print(f"{READY_MARKER} {args.job}:{args.index} {server.target} pid={os.getpid()}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
