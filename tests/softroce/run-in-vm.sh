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

say() { echo "[softroce] $*" >&2; }
fail() { say "$*"; exit 125; }

[ $# -ge 1 ] || { echo "usage: $0 CMD [ARG...]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || fail "needs root: qemu exports the host's / to the guest over 9p"

if ! command -v qemu-system-x86_64 >/dev/null; then
    say "installing qemu-system-x86"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends qemu-system-x86 >/dev/null; } || fail "apt-get install qemu-system-x86 failed"
fi

mkdir -p "$VM_DIR" || fail "cannot create $VM_DIR"
# One build at a time; later runs only read the image.
exec 8>"$VM_DIR/.lock"
flock 8
if [ ! -f "$VM_DIR/kver" ] || [ "${RDMADEV_VM_REBUILD:-0}" = 1 ]; then
    rm -f "$VM_DIR/kver"
    "$HERE/build-image.sh" "$VM_DIR" || fail "building the guest image failed"
fi
flock -u 8

RUN=$(mktemp -d "$VM_DIR/run.XXXXXX") || fail "cannot create a run directory"
QEMU_PID=
TIMER_PID=
cleanup() {
    [ -n "$TIMER_PID" ] && kill "$TIMER_PID" 2>/dev/null
    if [ -n "$QEMU_PID" ] && kill -TERM "$QEMU_PID" 2>/dev/null; then
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$QEMU_PID" 2>/dev/null
    fi
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The command and the caller's environment, for bash inside the guest.
{
    export -p | grep -vE '^declare -x (PWD|OLDPWD|SHLVL|_|TERM|HOSTNAME|BASH_[A-Z_]+|SSH_[A-Z_]+|DISPLAY)(=|$)'
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
} > "$RUN/cmd.bash"
echo 'exec /bin/bash "$(dirname "$0")/cmd.bash"' > "$RUN/cmd"
pwd > "$RUN/cwd"

# KVM only with a real VMX/SVM module: this host's /dev/kvm is kvm_pvm, which cannot run a
# stock kernel, so software emulation (TCG) is the default here.
ACCEL=(-accel tcg,thread=multi -cpu max)
if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
    ACCEL=(-enable-kvm -cpu host)
fi
RW=()
RW_ARG=
if [ -n "${RDMADEV_VM_RW:-}" ]; then
    RW=(-virtfs "local,path=$RDMADEV_VM_RW,mount_tag=rw,security_model=none,multidevs=remap")
    RW_ARG="rdv_rw=$RDMADEV_VM_RW"
fi

qemu-system-x86_64 "${ACCEL[@]}" -m "$MEM" -smp "$SMP" \
    -nodefaults -no-user-config -display none -no-reboot -nic none \
    -kernel "$VM_DIR/vmlinux" -initrd "$VM_DIR/initrd.img" \
    -append "console=ttyS0 quiet panic=-1 rdv_init=$HERE/guest-init.sh rdv_run=$RUN $RW_ARG" \
    -serial "file:$RUN/console.log" -chardev stdio,id=cmdout,signal=off -serial chardev:cmdout \
    -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$VM_DIR/rootfs,mount_tag=pkgs,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$RUN,mount_tag=run,security_model=none,multidevs=remap" \
    "${RW[@]}" < /dev/null &
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
[ "${RDMADEV_VM_VERBOSE:-0}" = 1 ] && cat "$RUN/console.log" >&2
if [ ! -s "$RUN/rc" ]; then
    tail -n 30 "$RUN/console.log" >&2
    fail "the VM stopped (qemu status $QRC) without reporting the command's exit status"
fi
exit "$(cat "$RUN/rc")"
