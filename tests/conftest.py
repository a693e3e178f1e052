"""Shared fixtures: the fabrics to test, a cluster secret, peer processes."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import rdmadev  # noqa: E402
from remote import RemotePeer  # noqa: E402
from rdmadev.testing import launch  # noqa: E402

# Under pytest-xdist (README: `pytest -n 2`), each worker's clusters, and those its tests'
# subprocesses start, pick ports from a slice of their own (launch.PORT_SLICE_ENV).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ[launch.PORT_SLICE_ENV] = "%d/%s" % (
        int(os.environ["PYTEST_XDIST_WORKER"].lstrip("gw")),
        os.environ["PYTEST_XDIST_WORKER_COUNT"])

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


@pytest.fixture(scope="module")
def _peers():
    """The peer processes of a module, by fabric (see peer)."""
    peers = {}
    yield peers
    for p in peers.values():
        p.close()


@pytest.fixture
def peer(fabric, _peers):
    """A peer process with its own Domain on `fabric`. One process serves a module's tests
    (starting one costs a second here and 10-20 s in the Soft-RoCE guest): what a test made in
    it is dropped before the next, and a test that killed it, or left it unable to answer,
    gets a new one for the next."""
    p = _peers.get(fabric)
    if p is not None and (p.pending or not p.proc.is_alive()):
        p.kill()  # a test ended while the peer was still running a call for it, or killed it
        p = None
    if p is not None:
        p.call("reset", timeout=30)
    else:
        p = _peers[fabric] = RemotePeer(fabric, SECRET)
    yield p


@pytest.fixture
def secret():
    return SECRET


def pytest_collection_modifyitems(config, items):
    """Deselects the shm instances of tests marked `breaks_connection`: a shm endpoint has no
    connection that could break (it watches its peer's pidfd)."""
    def on_shm(item):
        params = getattr(getattr(item, "callspec", None), "params", {})
        return "shm" in (params.get("world"), params.get("fabric"))
    dropped = [i for i in items if i.get_closest_marker("breaks_connection") and on_shm(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]
