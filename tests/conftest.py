"""Shared fixtures: the fabrics to test, a cluster secret, peer processes."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import rdmadev  # noqa: E402
from remote import RemotePeer  # noqa: E402

SECRET = b"rdmadev-test-cluster-secret"


def _fabrics():
    """Every fabric viable here. verbs joins when viable; with RDMADEV_REQUIRE_VERBS=1 (the
    Soft-RoCE CI tier) it is always listed, so a non-viable verbs fails instead of skipping."""
    names = rdmadev.viable_fabrics()
    if os.environ.get("RDMADEV_REQUIRE_VERBS") == "1" and "verbs" not in names:
        names.append("verbs")
    return names


FABRICS = _fabrics()


@pytest.fixture(params=FABRICS)
def fabric(request):
    return request.param


@pytest.fixture
def domain(fabric):
    """This process's Domain on `fabric`."""
    dom = rdmadev.open_domain("test:local", rdmadev.Config(fabric=fabric, secret=SECRET))
    yield dom
    dom.close()


@pytest.fixture
def peer(fabric):
    """A peer process with its own Domain on `fabric`."""
    p = RemotePeer(fabric, SECRET)
    yield p
    p.close()


@pytest.fixture
def secret():
    return SECRET
