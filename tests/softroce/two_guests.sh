#!/usr/bin/env bash
# two_guests.sh [PYTEST_ARG...]: the two-guest Soft-RoCE tier. Two QEMU guests joined by one
# virtual Ethernet wire (run-two-vms.sh), rxe0 on each guest's NIC; rdmadev in guest a tests
# against ends in guest b (two_hosts.py serves them, across_guests.py holds the tests: fabric
# writes of 0 B to 16 MiB, reads, a stage read, signals and credits on verbs and tcp, channel
# setup and a reset connection through the control plane, the pyverbs peer, the fabric picked
# across guests). Extra arguments go to guest a's pytest.
#
# With RDMADEV_SOFTROCE_TF=1, then: one TF job across the guests over verbs (ps in a, two
# workers and the coordinator in b; tf_across_guests.py), bitwise equal to gRPC. Not run by
# default: its four TF processes take ~260 s to start in the guests, ~450 s in all (measured).
# Both guests run with RDMADEV_ACK_TIMEOUT=18 (1.07 s; docs/testing.md says why): rxe acks from
# a TCG guest's kernel come later than the default 268 ms on a loaded host.
# Exit status: nonzero when either guest's part failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ACK=RDMADEV_ACK_TIMEOUT=${RDMADEV_ACK_TIMEOUT:-18}
tests/softroce/run-two-vms.sh env RDMADEV_REQUIRE_VERBS=1 "$ACK" python3 tests/softroce/two_hosts.py "$@" || exit
[ "${RDMADEV_SOFTROCE_TF:-0}" = 1 ] || exit 0
RDMADEV_VM_MEM=${RDMADEV_VM_MEM:-3072} RDMADEV_VM_SMP=${RDMADEV_VM_SMP:-2} \
    RDMADEV_VM_TIMEOUT=${RDMADEV_VM_TIMEOUT:-3000} \
    tests/softroce/run-two-vms.sh env "$ACK" python3 tests/softroce/tf_across_guests.py train
