#!/usr/bin/env bash
# run-two-vms.sh CMD [ARG...]: runs CMD in two throw-away Soft-RoCE guests at once, "a" and
# "b", joined by one virtual Ethernet wire, and exits nonzero when either command failed.
#
# The guests are run-in-vm.sh's (vm-lib.sh: the host's / read-only over 9p, the RDMA
# userspace over it, a tmpfs on top, CMD as root in the caller's cwd and environment), each
# with a virtio-net NIC eth0 instead of the dummy interface, and its rxe0 on that NIC. The
# wire is QEMU's dgram network backend: each guest's NIC sends its Ethernet frames as UDP
# datagrams to the other's port on the host's loopback, nothing else (no host bridge, tap or
# routing). Guest a is 10.9.8.1/24, guest b 10.9.8.2/24, with distinct MACs, so distinct
# GIDs (fe80::<from the MAC> and ::ffff:10.9.8.x).
#
# CMD runs in both; it finds its part in the environment:
#   RDMADEV_GUEST=a|b                   which guest this is
#   RDMADEV_GUEST_ADDR, RDMADEV_PEER_ADDR  its own address and the other guest's
#   RDMADEV_GUESTS_DIR=DIR              a fresh directory both guests read and write (the
#                                       rendezvous; the host's copy is removed afterwards)
# Output: each guest's lines prefixed with "a| " or "b| ".
#
# Exit status: 0 when both commands exited 0; else the first nonzero of a's and b's (124 for
# a guest stopped at RDMADEV_VM_TIMEOUT, or RDMADEV_VM_PEER_GRACE seconds (default 120) after
# the other guest ended; 125 for a guest that died without reporting one). Both VMs are
# always stopped on exit.
#
# Knobs as run-in-vm.sh (RDMADEV_VM_DIR, _TIMEOUT, _RW, _VERBOSE, _REBUILD) and, per guest,
# RDMADEV_VM_MEM (default 1536: the tier's 64 MiB each way fits) and RDMADEV_VM_SMP (default
# 1: two guests of one vCPU each on a 2-core host leave room for the host's other work).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VM_DIR=${RDMADEV_VM_DIR:-/tmp/rdmadev-softroce}
TIMEOUT=${RDMADEV_VM_TIMEOUT:-900}
GRACE=${RDMADEV_VM_PEER_GRACE:-120}
MEM=${RDMADEV_VM_MEM:-1536}
SMP=${RDMADEV_VM_SMP:-1}

[ $# -ge 1 ] || { echo "usage: $0 CMD [ARG...]" >&2; exit 2; }
. "$HERE/vm-lib.sh"
vm_prepare

BASE=$(mktemp -d "$VM_DIR/run2.XXXXXX") || fail "cannot create a run directory"
mkdir "$BASE/a" "$BASE/b" "$BASE/xchg"
declare -A PID=()
TIMER_PID=
cleanup() {
    [ -n "$TIMER_PID" ] && kill "$TIMER_PID" 2>/dev/null
    [ ${#PID[@]} -gt 0 ] && vm_stop "${PID[@]}"
    rm -rf "$BASE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two free UDP ports on the host's loopback, one per end of the wire.
read -r PORT_A PORT_B < <(python3 -c '
import socket
s = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))') || fail "cannot pick two UDP ports on 127.0.0.1"

declare -A ADDR=([a]=10.9.8.1 [b]=10.9.8.2) PEER=([a]=b [b]=a)
declare -A LOCAL=([a]=$PORT_A [b]=$PORT_B)
for g in a b; do
    p=${PEER[$g]}
    (
        export RDMADEV_GUEST=$g RDMADEV_GUEST_ADDR=${ADDR[$g]} RDMADEV_PEER_ADDR=${ADDR[$p]} \
            RDMADEV_GUESTS_DIR=$BASE/xchg
        vm_write_cmd "$BASE/$g" "$@"
    )
    vm_qemu "$BASE/$g" "rdv_net=${ADDR[$g]}/24 rdv_host=guest-$g rdv_xchg=$BASE/xchg" \
        -virtfs "local,path=$BASE/xchg,mount_tag=xchg,security_model=none,multidevs=remap" \
        -netdev "dgram,id=wire,local.type=inet,local.host=127.0.0.1,local.port=${LOCAL[$g]},remote.type=inet,remote.host=127.0.0.1,remote.port=${LOCAL[$p]}" \
        -device "virtio-net-pci,netdev=wire,mac=52:54:00:09:08:0${ADDR[$g]##*.}" \
        > >(sed -u "s/^/$g| /") &
    PID[$g]=$!
done

sleep "$TIMEOUT" &
TIMER_PID=$!
WHY="timed out after ${TIMEOUT}s"
declare -A QRC=()
deadline_set=
while [ ${#QRC[@]} -lt 2 ]; do
    wait -n "${PID[@]}" "$TIMER_PID"
    if ! kill -0 "$TIMER_PID" 2>/dev/null; then
        TIMER_PID=
        say "${WHY}; the VMs are killed"
        break   # a guest still running counts as 124; cleanup stops it
    fi
    for g in a b; do
        [ -n "${PID[$g]:-}" ] && ! kill -0 "${PID[$g]}" 2>/dev/null || continue
        wait "${PID[$g]}"
        QRC[$g]=$?
        unset "PID[$g]"
    done
    # The first guest ended: the other gets GRACE seconds more, not the whole TIMEOUT.
    if [ ${#QRC[@]} = 1 ] && [ -z "$deadline_set" ]; then
        deadline_set=1
        kill "$TIMER_PID" 2>/dev/null
        wait "$TIMER_PID" 2>/dev/null
        WHY="guest ${!QRC[*]} ended and the other did not within ${GRACE}s"
        sleep "$GRACE" &
        TIMER_PID=$!
    fi
done
[ -n "$TIMER_PID" ] && kill "$TIMER_PID" 2>/dev/null && wait "$TIMER_PID" 2>/dev/null
TIMER_PID=
RC=0
for g in a b; do
    if [ -n "${QRC[$g]:-}" ]; then rc=$(vm_rc "$BASE/$g" "${QRC[$g]}"); else rc=124; fi
    [ "$rc" = 0 ] || say "guest $g: exit status $rc"
    [ "$RC" = 0 ] && RC=$rc
done
exit "$RC"
