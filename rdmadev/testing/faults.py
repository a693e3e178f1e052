"""Faults tests inject into a running job that no signal or link state gives."""

import subprocess

__all__ = ["reset_connections"]


def reset_connections(address, pid, fabric):
    """Resets the established tcp connections of process `pid` to `fabric` of the rdmadev
    Domain at `address` (Domain.address: "tcp=host:port;verbs=host:port/gid;..."; on verbs,
    the side channel that tells each end the other is alive) with ``ss -K`` (the kernel's
    SOCK_DESTROY, root only). Both ends see a reset, as when a peer refuses a frame or a
    middlebox cuts the connection, while both processes go on running. Only loopback or a
    namespace of the test's own may carry them.

    Returns:
        How many connections were reset.
    """
    reach = dict(item.split("=", 1) for item in address.split(";"))[fabric]
    port = reach.split("/", 1)[0].rsplit(":", 1)[1]
    listed = subprocess.run(["ss", "-tnpH", "state", "established", "dport", "=", f":{port}"],
                            capture_output=True, text=True, check=True).stdout
    local = [line.split()[2].rsplit(":", 1)[1] for line in listed.splitlines()
             if f"pid={pid}," in line]
    for sport in local:
        subprocess.run(["ss", "-K", "dport", "=", f":{port}", "sport", "=", f":{sport}"],
                       capture_output=True, check=True)
    return len(local)
