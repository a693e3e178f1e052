"""A loopback 1 ps + 2 worker cluster of `rdmadev serve` tasks, shared by the e2e tests."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_util import ENV, rdmadev_launcher, tf_cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    c = tf_cluster.Cluster(env=ENV, launcher=rdmadev_launcher)
    c.start()
    yield c
    c.stop()
