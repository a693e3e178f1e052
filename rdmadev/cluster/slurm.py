"""A TF cluster from a Slurm job step: the checks and arguments around TF's SlurmClusterResolver.

TF's ``tf.distribute.cluster_resolver.SlurmClusterResolver`` reads the step's environment
(SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE) and builds the cluster: the
step's tasks, node by node in sorted node order, get ports ``port_base``, ``port_base + 1``, ...
on their node, and the jobs take the ranks in the sorted order of their names. With jobs
``chief=1,ps=1,worker=2`` Slurm task 0 is the chief (the coordinator), 1 the ps, 2 and 3 the
workers. Every task that builds the resolver with the same arguments gets the same cluster:
`rdmadev serve --slurm` in the ps and workers, the training script in the chief, both with
:func:`resolver_args`.

Pure Python (no TensorFlow): the checks run before `rdmadev serve` imports TF.

Example:
    >>> jobs = parse_jobs("chief=1,ps=1,worker=2")
    >>> check_step(jobs)                       # inside `srun --ntasks=4 ...`
    >>> resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
    ...     **resolver_args(jobs, port_base=8888, rpc_layer="grpc+rdmadev"))
"""
import os
import re
import shutil

from ..errors import ConfigError

__all__ = ["PORT_BASE", "parse_jobs", "in_step", "check_step", "resolver_args"]

#: TF's SlurmClusterResolver's default first port on each node.
PORT_BASE = 8888
#: What a Slurm step's task sees; TF's resolver reads all four.
STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                  "SLURM_STEP_TASKS_PER_NODE")
JOBS_HINT = "pass the jobs and their task counts, e.g. --slurm chief=1,ps=1,worker=2"
_JOB = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([0-9]+)$")


def parse_jobs(text):
    """``"chief=1,ps=1,worker=2"`` -> ``{"chief": 1, "ps": 1, "worker": 2}``.

    Raises:
        ConfigError: naming the entry that is not ``job=count`` (count >= 1) or is repeated.
    """
    jobs = {}
    for part in (text or "").split(","):
        m = _JOB.match(part.strip())
        if not m or int(m.group(2)) < 1:
            raise ConfigError(f"Slurm jobs {text!r}: {part!r} is not job=count with a count >= 1",
                              hint=JOBS_HINT)
        if m.group(1) in jobs:
            raise ConfigError(f"Slurm jobs {text!r} name job {m.group(1)!r} twice", hint=JOBS_HINT)
        jobs[m.group(1)] = int(m.group(2))
    return jobs


def in_step(env=None):
    """Whether this process is a task of a Slurm job step (srun set its variables)."""
    env = os.environ if env is None else env
    return all(v in env for v in STEP_VARIABLES)


def check_step(jobs, env=None):
    """Checks that this process is a task of a Slurm step with as many tasks as `jobs` asks.

    Raises:
        ConfigError: not inside a step (a batch script's own shell is not one), or the step's
            task count differs from the jobs' total.
    """
    env = os.environ if env is None else env
    missing = [v for v in STEP_VARIABLES if v not in env]
    if missing:
        raise ConfigError(f"not a task of a Slurm job step ({', '.join(missing)} unset)",
                          hint="start every task with srun, inside an sbatch script or salloc")
    wanted, tasks = sum(jobs.values()), env["SLURM_STEP_NUM_TASKS"]
    if tasks != str(wanted):
        listed = ",".join(f"{job}={n}" for job, n in jobs.items())
        raise ConfigError(f"the Slurm step has {tasks} tasks but the jobs {listed} need {wanted}",
                          hint=f"start the step with srun --ntasks={wanted} (sbatch --ntasks={wanted})")


def resolver_args(jobs, port_base=PORT_BASE, rpc_layer="grpc+rdmadev", env=None):
    """Keyword arguments of TF's SlurmClusterResolver for `jobs`, the same in every task.

    On a node where TF finds no GPU to count (no CUDA_VISIBLE_DEVICES, no nvidia-smi), TF's
    resolver fails (it runs nvidia-smi) and cannot be told "no GPUs": it gives a node only
    as many tasks as GPU slots (tensorflow/tensorflow#56894). There the arguments give every
    task one slot, as many slots as tasks, and leave CUDA_VISIBLE_DEVICES alone; its
    num_accelerators() then says 1 GPU per task, which ParameterServerStrategy does not read
    (it counts the workers' devices). Elsewhere TF's own GPU defaults apply.

    Args:
        jobs: ``{job: task count}`` (parse_jobs).
        port_base: the first TF port on each node; the next tasks of a node take the next ports,
            and each task's rdmadev control service listens RDMADEV_CONTROL_PORT_OFFSET above.
        rpc_layer: the protocol the coordinator connects with.
    """
    env = os.environ if env is None else env
    args = {"jobs": dict(jobs), "port_base": int(port_base), "rpc_layer": rpc_layer}
    if not env.get("CUDA_VISIBLE_DEVICES") and not shutil.which("nvidia-smi"):
        args.update(gpus_per_node=sum(jobs.values()), gpus_per_task=1, auto_set_gpu=False)
    return args
