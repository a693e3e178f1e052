# PID 1 of the Soft-RoCE guest (run by the host's /bin/sh, the root being the host's / with
# the RDMA userspace over it). Loads rdma_rxe, makes rxe0 on a dummy netdev (no NIC: no
# traffic can leave the guest), or with rdv_net=ADDR/PREFIX (run-two-vms.sh) on the
# virtio-net NIC eth0 with that address (the virtual wire to the other guest), runs the command run-in-vm.sh wrote into the run share and
# leaves its exit status there, then powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
for kv in $(cat /proc/cmdline); do
    case $kv in rdv_run=*|rdv_rw=*|rdv_xchg=*|rdv_net=*|rdv_host=*) eval "$kv";; esac
done
power_off() { sync; echo o > /proc/sysrq-trigger; sleep 10; }
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 run "$rdv_run" || power_off
if [ -n "${rdv_rw:-}" ]; then
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rw "$rdv_rw" || echo "guest: cannot mount $rdv_rw read-write"
fi
if [ -n "${rdv_xchg:-}" ]; then   # run-two-vms.sh: the directory both guests share
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xchg "$rdv_xchg" || echo "guest: cannot mount $rdv_xchg"
fi
# ttyS0 carries the kernel console (a file on the host), ttyS1 the command's output.
stty -F /dev/ttyS1 raw -echo -onlcr 2>/dev/null
hostname "${rdv_host:-softroce}"
ip link set lo up
modprobe rdma_rxe && modprobe ib_uverbs && modprobe rdma_ucm || echo "guest: modprobe of the rdma modules failed"
if [ -n "${rdv_net:-}" ]; then
    NETDEV=eth0
    modprobe virtio_net
    ip link set eth0 up && ip addr add "$rdv_net" dev eth0 || echo "guest: cannot set up eth0 as $rdv_net"
else
    NETDEV=dummy0
    modprobe dummy
    ip link add dummy0 type dummy && ip link set dummy0 mtu 9000 up && ip addr add 10.9.9.1/24 dev dummy0
fi
rdma link add rxe0 type rxe netdev "$NETDEV" || echo "guest: rdma link add rxe0 failed"
# Root may pin all it likes (CAP_IPC_LOCK); the limit still matters to what the tests check.
ulimit -l unlimited
cd "$(cat "$rdv_run/cwd")" || cd /
/bin/sh "$rdv_run/cmd" < /dev/null > /dev/ttyS1 2>&1
echo $? > "$rdv_run/rc"
power_off
