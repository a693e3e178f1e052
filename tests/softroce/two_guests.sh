#!/usr/bin/env bash
# two_guests.sh [PYTEST_ARG...]: the two-guest Soft-RoCE tier. Two QEMU guests joined by one
# virtual Ethernet wire (run-two-vms.sh), rxe0 on each guest's NIC; rdmadev in guest a tests
# against ends in guest b (two_hosts.py serves them, across_guests.py holds the tests: fabric
# writes, reads, a stage, signals and credits on verbs and tcp, channel setup and a reset
# connection through the control plane, the pyverbs peer, the fabric picked across guests).
# Exit status: nonzero when either guest's part failed. Extra arguments go to guest a's pytest.
set -uo pipefail
cd "$(dirname "$0")/../.."
exec tests/softroce/run-two-vms.sh env RDMADEV_REQUIRE_VERBS=1 python3 tests/softroce/two_hosts.py "$@"
