# Sourced by run-in-vm.sh (one guest) and run-two-vms.sh (two guests on one virtual wire):
# the image, a run directory, the command file and the QEMU command line of one Soft-RoCE
# guest. The caller sets HERE, VM_DIR, MEM and SMP first.

say() { echo "[softroce] $*" >&2; }
fail() { say "$*"; exit 125; }

# Root (9p exports the whole / with security_model=none), qemu (installed with apt-get when
# missing) and the image in VM_DIR (built on first use), one runner at a time.
vm_prepare() {
    [ "$(id -u)" = 0 ] || fail "needs root: qemu exports the host's / to the guest over 9p"
    mkdir -p "$VM_DIR" || fail "cannot create $VM_DIR"
    exec 8>"$VM_DIR/.lock"
    flock 8   # runners started at once install qemu and build the image one at a time
    if ! command -v qemu-system-x86_64 >/dev/null; then
        say "installing qemu-system-x86"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends qemu-system-x86 >/dev/null; } || fail "apt-get install qemu-system-x86 failed"
    fi
    if [ ! -f "$VM_DIR/kver" ] || [ "${RDMADEV_VM_REBUILD:-0}" = 1 ]; then
        rm -f "$VM_DIR/kver"
        "$HERE/build-image.sh" "$VM_DIR" || fail "building the guest image failed"
    fi
    flock -u 8
}

# vm_write_cmd RUN CMD [ARG...]: the command and the caller's environment (with whatever the
# caller exported for this guest), for bash inside the guest, and the working directory.
vm_write_cmd() {
    local run=$1
    shift
    {
        export -p | grep -vE '^declare -x (PWD|OLDPWD|SHLVL|_|TERM|HOSTNAME|BASH_[A-Z_]+|SSH_[A-Z_]+|DISPLAY)(=|$)'
        printf 'exec'
        printf ' %q' "$@"
        printf '\n'
    } > "$run/cmd.bash"
    echo 'exec /bin/bash "$(dirname "$0")/cmd.bash"' > "$run/cmd"
    pwd > "$run/cwd"
}

# vm_qemu RUN KERNEL_ARGS [QEMU_ARG...]: runs qemu (in the foreground: the caller puts it in
# the background) for the guest whose run share is RUN; the command's output goes to stdout,
# the kernel console to RUN/console.log. Without a NIC among QEMU_ARG the guest has none.
vm_qemu() {
    local run=$1 kargs=$2
    shift 2
    # KVM only with a real VMX/SVM module: this host's /dev/kvm is kvm_pvm, which cannot run
    # a stock kernel, so software emulation (TCG) is the default here.
    local accel=(-accel tcg,thread=multi -cpu max)
    if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
        accel=(-enable-kvm -cpu host)
    fi
    local rw=()
    if [ -n "${RDMADEV_VM_RW:-}" ]; then
        rw=(-virtfs "local,path=$RDMADEV_VM_RW,mount_tag=rw,security_model=none,multidevs=remap")
        kargs="$kargs rdv_rw=$RDMADEV_VM_RW"
    fi
    exec qemu-system-x86_64 "${accel[@]}" -m "$MEM" -smp "$SMP" \
        -nodefaults -no-user-config -display none -no-reboot \
        -kernel "$VM_DIR/vmlinux" -initrd "$VM_DIR/initrd.img" \
        -append "console=ttyS0 quiet panic=-1 rdv_init=$HERE/guest-init.sh rdv_run=$run $kargs" \
        -serial "file:$run/console.log" -chardev stdio,id=cmdout,signal=off -serial chardev:cmdout \
        -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
        -virtfs "local,path=$VM_DIR/rootfs,mount_tag=pkgs,security_model=none,readonly=on,multidevs=remap" \
        -virtfs "local,path=$run,mount_tag=run,security_model=none,multidevs=remap" \
        "${rw[@]}" "$@" < /dev/null
}

# vm_rc RUN QEMU_STATUS: prints the command's exit status the guest left in RUN, or says why
# there is none (the console's tail) and prints 125.
vm_rc() {
    [ "${RDMADEV_VM_VERBOSE:-0}" = 1 ] && cat "$1/console.log" >&2
    if [ -s "$1/rc" ]; then
        cat "$1/rc"
    else
        tail -n 30 "$1/console.log" >&2
        say "the VM stopped (qemu status $2) without reporting the command's exit status"
        echo 125
    fi
}

# vm_stop PID...: TERM, up to 5 s, then KILL; each a qemu this script started.
vm_stop() {
    local pid live
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null; done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        live=
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && live=1; done
        [ -n "$live" ] || return 0
        sleep 0.5
    done
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null; done
}
