"""README's main command, as a user runs it: trains through rdmadev, matches gRPC, exits quietly."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Three TF servers start on 2 cores (5-9 s each, ~40 s loaded) plus two traces: generous.
TIMEOUT_S = 600


def test_train_ps_matches_grpc_and_exits_without_stray_errors():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_ps.py"), "--steps", "5"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "losses and final weights identical to TF's gRPC path: yes" in proc.stdout
    assert "transfers swapped" in proc.stdout and "cluster stopped" in proc.stdout
    # TF logs "Failed to remove function remotely" when a function outlives the cluster.
    assert "Failed to remove function" not in proc.stderr, proc.stderr[-3000:]
