"""One TensorFlow-level run over verbs (run it inside the Soft-RoCE guest):

    tests/softroce/run-in-vm.sh python tests/softroce/tf_over_verbs.py

Starts a loopback 1 ps + 2 worker cluster of `rdmadev serve` tasks with RDMADEV_FABRIC=verbs
(every task's domain opens only the verbs fabric, so every planned transfer is an RDMA
WRITE over rxe0), runs the e2e suite's training scenario once through TF's gRPC and once
through rdmadev.optimize, and checks that the losses and weights are bitwise identical.
Exit status 0 on success; prints the rdmadev report (which transfers were swapped).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import e2e_util  # noqa: E402
from e2e_util import ENV, rdmadev_launcher, run_driver, tf_cluster  # noqa: E402

# TF under software emulation starts ~10x slower than on the host.
READY_TIMEOUT_S = 900
e2e_util.DRIVER_TIMEOUT_S = 1500


def main():
    env = {**ENV, "RDMADEV_FABRIC": "verbs"}
    with tf_cluster.Cluster(env=env, launcher=rdmadev_launcher,
                            ready_timeout=READY_TIMEOUT_S) as cluster:
        grpc = run_driver(cluster, "grpc", "train")
        rdma = run_driver(cluster, "rdmadev", "train", env={"RDMADEV_FABRIC": "verbs"})
    same = (rdma["losses"] == grpc["losses"] and rdma["w"] == grpc["w"] and rdma["b"] == grpc["b"])
    print(rdma["report"])
    print(f"losses (first, last): grpc {grpc['losses'][0]:.6f} {grpc['losses'][-1]:.6f}; "
          f"rdmadev over verbs {rdma['losses'][0]:.6f} {rdma['losses'][-1]:.6f}")
    print("RESULT:", "bitwise identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
