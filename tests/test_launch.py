"""rdmadev.testing.launch's port picks: below the kernel's ephemeral range, with the task's
control port, so that no bind of port 0 (a task's own rdmadev listeners, any outgoing
connection) can take one before the task binds it."""
import socket

from rdmadev.cluster.control import control_address
from rdmadev.testing import launch


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    floor = launch.ephemeral_floor()
    ports = launch.free_ports(40)
    controls = [control_address(f"{launch.HOST}:{p}")[1] for p in ports]
    assert len(set(ports + controls)) == 2 * len(ports)
    if floor > launch.PORT_FLOOR:  # Linux's default range starts at 32768
        assert all(launch.PORT_FLOOR <= p < floor for p in ports + controls), (floor, ports)
    ephemeral = socket.socket()
    ephemeral.bind((launch.HOST, 0))
    try:
        assert ephemeral.getsockname()[1] not in ports + controls
        for p in ports + controls:
            with socket.socket() as s:
                s.bind((launch.HOST, p))
    finally:
        ephemeral.close()
