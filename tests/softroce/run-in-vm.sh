#!/usr/bin/env bash
# run-in-vm.sh CMD [ARG...]: runs CMD inside a throw-away QEMU guest that has a Soft-RoCE
# device (rxe0 over rdma_rxe, Debian's 6.1 kernel) and exits with CMD's exit status.
#
# The guest's root is the host's own / (read-only over virtio-9p) with the RDMA userspace
# laid over it and a tmpfs on top, so this checkout, its Python and its venvs work inside
# unchanged; every write the guest makes is thrown away, except under RDMADEV_VM_RW. CMD runs
# as root in the caller's working directory with the caller's environment. There is no NIC:
# rxe0 sits on a dummy interface (10.9.9.1), so no traffic leaves the guest.
#
# Exit status: CMD's, or 124 when RDMADEV_VM_TIMEOUT passed (the VM is killed), or 125 when
# the VM could not be built or died without reporting one.
#
# Knobs (environment):
#   RDMADEV_VM_DIR=/tmp/rdmadev-softroce  image cache (built on first use, ~75 MB of .debs)
#   RDMADEV_VM_TIMEOUT=900  seconds before the VM is killed
#   RDMADEV_VM_MEM=2048     guest MiB (the fabric suite's 64 MiB transfers need room on tmpfs)
#   RDMADEV_VM_SMP=2        guest vCPUs
#   RDMADEV_VM_RW=DIR       mount host DIR read-write at the same path (results, reports)
#   RDMADEV_VM_VERBOSE=1    print the guest's kernel console afterwards
#   RDMADEV_VM_REBUILD=1    rebuild the image
# Needs root on the host (9p exports the whole / with security_model=none) and installs
# qemu-system-x86 with apt-get when it is missing.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VM_DIR=${RDMADEV_VM_DIR:-/tmp/rdmadev-softroce}
TIMEOUT=${RDMADEV_VM_TIMEOUT:-900}
MEM=${RDMADEV_VM_MEM:-2048}
SMP=${RDMADEV_VM_SMP:-2}

[ $# -ge 1 ] || { echo "usage: $0 CMD [ARG...]" >&2; exit 2; }
. "$HERE/vm-lib.sh"
vm_prepare

RUN=$(mktemp -d "$VM_DIR/run.XXXXXX") || fail "cannot create a run directory"
QEMU_PID=
TIMER_PID=
cleanup() {
    [ -n "$TIMER_PID" ] && kill "$TIMER_PID" 2>/dev/null
    [ -n "$QEMU_PID" ] && vm_stop "$QEMU_PID"
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

vm_write_cmd "$RUN" "$@"
vm_qemu "$RUN" "" -nic none &
QEMU_PID=$!
# The time limit: whichever ends first, qemu or this timer.
sleep "$TIMEOUT" &
TIMER_PID=$!
wait -n "$QEMU_PID" "$TIMER_PID"
if ! kill -0 "$TIMER_PID" 2>/dev/null; then
    TIMER_PID=
    say "timed out after ${TIMEOUT}s; the VM is killed"
    exit 124   # cleanup stops qemu
fi
wait "$QEMU_PID"
QRC=$?
QEMU_PID=
kill "$TIMER_PID" 2>/dev/null
wait "$TIMER_PID" 2>/dev/null
TIMER_PID=
exit "$(vm_rc "$RUN" "$QRC")"
