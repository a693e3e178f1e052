"""Faults tests inject into a running job that no signal or link state gives."""

import subprocess

__all__ = ["reset_tcp_connections"]


def reset_tcp_connections(address, pid):
    """Resets the established tcp connections of process `pid` to the rdmadev Domain at
    `address` ("...;tcp=host:port", Domain.address) with ``ss -K`` (the kernel's
    SOCK_DESTROY, root only): both ends see a reset, as when a peer refuses a frame or a
    middlebox cuts the connection, while both processes go on running. Only loopback or a
    namespace of the test's own may carry them.

    Returns:
        How many connections were reset.
    """
    port = dict(item.split("=", 1) for item in address.split(";"))["tcp"].rsplit(":", 1)[1]
    listed = subprocess.run(["ss", "-tnpH", "state", "established", "dport", "=", f":{port}"],
                            capture_output=True, text=True, check=True).stdout
    local = [line.split()[2].rsplit(":", 1)[1] for line in listed.splitlines()
             if f"pid={pid}," in line]
    for sport in local:
        subprocess.run(["ss", "-K", "dport", "=", f":{port}", "sport", "=", f":{sport}"],
                       capture_output=True, check=True)
    return len(local)
