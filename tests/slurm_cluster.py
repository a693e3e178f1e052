"""A private single-node Slurm for tests: its own munged (key and socket), slurmctld and slurmd,
configured in a temporary folder, on ports picked free; needs root and Debian's packages
(PACKAGES).

The daemons run in the foreground under a supervisor process (`python slurm_cluster.py
supervise DIR`, this file) that is their parent and a child subreaper: the step daemons
(slurmstepd) slurmd starts detach from it and are reparented to the supervisor, which reaps
them too, so no process Slurm starts outlives stop() or becomes a zombie. The supervisor stops
everything when the test process dies without calling stop() (PR_SET_PDEATHSIG).

Example::

    with SlurmCluster() as slurm:
        job = slurm.submit(["train.sbatch"], cwd="examples/slurm")
        state, code = slurm.wait(job, timeout=300)
"""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from rdmadev.cluster.control import control_address
from rdmadev.testing import launch

#: Debian's package of each program used.
PACKAGES = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "sbatch": "slurm-client", "srun": "slurm-client", "scontrol": "slurm-client",
            "scancel": "slurm-client", "sinfo": "slurm-client", "squeue": "slurm-client"}
REQUIRE_ENV = "RDMADEV_REQUIRE_SLURM"
#: The node's name; every address in its jobs is 127.0.0.1 (test traffic stays on loopback).
NODE = "localhost"
#: CPUs declared for the node (slurmd takes them over the 2 it finds: config_overrides), so
#: three jobs of 4 tasks, one CPU each, run at once.
CPUS = 12
#: Seconds the daemons get to come up (the node idle in sinfo): about 2 s on an idle machine.
START_TIMEOUT_S = 60
#: Seconds Slurm waits between SIGTERM and SIGKILL when it ends a step (KillWait; its default
#: is 30): what cancelling a job may take.
KILL_WAIT_S = 5
#: Seconds each daemon gets to exit after SIGTERM before the supervisor SIGKILLs it.
STOP_GRACE_S = 10
POLL_S = 0.2
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
               "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def unavailable_reason():
    """Why a private Slurm cannot start here ("" if it can)."""
    if os.geteuid() != 0:
        return "a private Slurm (munged, slurmctld, slurmd) needs root"
    missing = sorted({pkg for tool, pkg in PACKAGES.items() if not shutil.which(tool)})
    if missing:
        return f"Slurm is not installed (apt-get install {' '.join(missing)})"
    return ""


def require():
    """Skips the calling test when no private Slurm can start, saying why; fails it instead
    under RDMADEV_REQUIRE_SLURM=1, so that CI cannot pass by skipping."""
    import pytest
    reason = unavailable_reason()
    if not reason:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 says it must be there")
    pytest.skip(reason)


def port_free(port):
    """Whether nothing listens on `port` on any address (TF's server and rdmadev's hold of a
    task's port bind every address, IPv4 and IPv6)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("::", port))
            return True
        except OSError:
            return False


def consecutive_free_ports(count, attempts=200):
    """The first of `count` consecutive ports free on every address, each with its rdmadev
    control port: the TF ports TF's SlurmClusterResolver gives a node's tasks. Picked from
    this run's slice (launch.free_ports); they stay free only until something else binds them."""
    for _ in range(attempts):
        base = launch.free_ports(1)[0]
        if all(port_free(p) for i in range(count)
               for p in (base + i, control_address(f"127.0.0.1:{base + i}")[1])):
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {attempts} attempts")


def _conf(d, ctld_port, node_port):
    return f"""\
ClusterName=rdmadevtest
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait={KILL_WAIT_S}
SlurmdParameters=config_overrides
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """See the module docstring. `env` is what a Slurm command of this cluster needs."""

    def __init__(self):
        self.dir = None
        self.env = None
        self._supervisor = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="rdmadev-slurm-")
        os.chmod(self.dir, 0o755)  # munged wants every folder up to its socket searchable
        for sub, mode in (("munge", 0o755), ("key", 0o700), ("state", 0o700), ("spool", 0o755)):
            os.mkdir(os.path.join(self.dir, sub), mode)
        key = os.path.join(self.dir, "key", "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        conf = os.path.join(self.dir, "slurm.conf")
        with open(conf, "w") as f:
            f.write(_conf(self.dir, *launch.free_ports(2)))
        self.env = {**os.environ, "SLURM_CONF": conf}
        with open(os.path.join(self.dir, "supervisor.log"), "wb") as log:
            self._supervisor = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "supervise", self.dir],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        try:
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_idle(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._supervisor.poll() is not None:
                raise RuntimeError(f"the Slurm supervisor exited ({self._supervisor.returncode}): "
                                   + self.logs())
            state = self.run(["sinfo", "-h", "-n", NODE, "-o", "%T"], check=False).stdout.strip()
            if state == "idle":
                return
            time.sleep(POLL_S * 5)
        raise RuntimeError(f"Slurm's node not idle after {START_TIMEOUT_S} s: " + self.logs())

    def logs(self, tail=3000):
        """The tail of every daemon's log, for an error message."""
        out = []
        for name in ("supervisor.log", "slurmctld.log", "slurmd.log"):
            try:
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-tail:]}")
            except OSError:
                pass
        return "\n".join(out)

    def run(self, argv, check=True, timeout=30, cwd=None, env=None):
        """A Slurm command against this cluster (`env` added to its environment); its
        CompletedProcess (text)."""
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env={**self.env, **(env or {})})
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def submit(self, argv, cwd=None, env=None):
        """`sbatch --parsable ARGV...`; the job id."""
        return self.run(["sbatch", "--parsable", *argv], cwd=cwd, env=env).stdout.strip().split(";")[0]

    def job(self, job_id):
        """``{field: value}`` of `scontrol show job` (one line: -o)."""
        line = self.run(["scontrol", "-o", "show", "job", job_id]).stdout.strip()
        return dict(f.split("=", 1) for f in line.split() if "=" in f)

    def wait(self, job_id, timeout):
        """(JobState, ExitCode) once the job has ended; RuntimeError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in DONE_STATES:
                return fields["JobState"], fields.get("ExitCode")
            time.sleep(POLL_S * 5)
        raise RuntimeError(f"job {job_id} did not end in {timeout} s: {self.job(job_id)}")

    def _cancel_all(self):
        """Cancels every job and waits (bounded) until Slurm has ended them."""
        self.run(["scancel", "--full", "--user=root"], check=False)
        deadline = time.monotonic() + KILL_WAIT_S + STOP_GRACE_S
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip():
                return
            time.sleep(POLL_S * 5)

    def stop(self):
        """Cancels every job, stops the daemons (the supervisor reaps them) and removes the
        folder. Idempotent."""
        if self._supervisor is not None:
            if self._supervisor.poll() is None:
                self._cancel_all()
                self._supervisor.send_signal(signal.SIGTERM)
                try:
                    self._supervisor.wait(3 * STOP_GRACE_S + KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    self._supervisor.kill()
                    self._supervisor.wait(STOP_GRACE_S)
            self._supervisor = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# --- the supervisor: `python slurm_cluster.py supervise DIR` -----------------------------------

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def _children():
    """Pids of this process's live children, reparented orphans included."""
    me, out = str(os.getpid()), []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me and fields[0] != "Z":  # ppid; state Z: exited, reaped below
            out.append(int(pid))
    return out


def _reap():
    """Reaps every exited child; their pids."""
    gone = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return gone
        if pid == 0:
            return gone
        gone.append(pid)


def _stop(pids):
    """SIGTERM `pids`, SIGKILL those left after STOP_GRACE_S, reaping all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            _reap()
            pids = [p for p in pids if p in _children()]
            if not pids:
                return
            time.sleep(POLL_S)


def supervise(d):
    """Runs munged, slurmctld and slurmd for `d`'s slurm.conf until SIGTERM (or the death of
    the parent), reaping everything reparented here; then stops them and whatever they left."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    conf = os.path.join(d, "slurm.conf")
    socket_path = os.path.join(d, "munge", "socket")
    daemons = {}  # pid -> name, in start order

    def start(*argv):
        daemons[subprocess.Popen(argv, stdin=subprocess.DEVNULL).pid] = argv[0]

    start("munged", "--foreground", "--force", f"--socket={socket_path}",
          f"--key-file={d}/key/munge.key", f"--pid-file={d}/munge/pid",
          f"--seed-file={d}/key/seed", f"--log-file={d}/munge/log")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(socket_path) and time.monotonic() < deadline and not stopping:
        time.sleep(POLL_S)
    start("slurmctld", "-D", "-i", "-f", conf)
    start("slurmd", "-D", "-N", NODE, "-f", conf)
    while not stopping:
        died = [daemons[pid] for pid in _reap() if pid in daemons]
        if died:
            print(f"supervisor: {', '.join(died)} exited; stopping", flush=True)
            break
        time.sleep(POLL_S)
    # The step daemons first (their jobs were cancelled), then slurmd, slurmctld and munged.
    _stop([pid for pid in _children() if pid not in daemons])
    for pid in reversed(list(daemons)):
        _stop([pid])
    for _ in range(3):  # what a stopped process leaves is reparented here in turn
        _stop(_children())
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["supervise"]:
        sys.exit(supervise(sys.argv[2]))
    sys.exit("usage: slurm_cluster.py supervise DIR")
