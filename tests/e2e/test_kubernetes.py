"""examples/kubernetes/: the TFJob manifest run as Kubernetes would run it, without Kubernetes.

Each replica of tfjob.yaml becomes a pod: a network namespace of its own on a bridge (tests/
pods.py), a pid namespace of its own (so the task is its pod's pid 1, and shm, which needs one
pid namespace, is not viable between pods, as between real pods), and a hosts file resolving
every pod's service name. Each runs its container's command with the environment the TFJob
operator gives the pod: the manifest's env (the secret's key from the Secret it names) and the
TF_CONFIG the operator writes (service names `<job>-<type>-<index>.<namespace>.svc`, the port of
the container port named tfjob-port, "environment": "cloud"). The image is this checkout: the
Dockerfile's COPY destinations map to the files it copies, `python3` to this interpreter and
`rdmadev` to `python -m rdmadev` (the console script the wheel installs).

What is checked: the manifest's control port is its TF port + RDMADEV_CONTROL_PORT_OFFSET; the
chief trains and every ps and worker carried tensors through rdmadev; the ps and workers end on
SIGTERM within Kubernetes' default grace period, as the operator ends them when the chief is
done (cleanPodPolicy: Running).

Not covered here: the RDMA device plugin and IPC_LOCK (there is no RDMA device; the pods talk
tcp), and building the image (no container runtime on the test machine).
"""
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml  # the test extra's pyyaml

import netns
import pods as pods_mod
from rdmadev.config import Config
from rdmadev.tf.server import READY_MARKER


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kubernetes"
#: A task's start (TF's import on a loaded 2-core machine) and the chief's whole job.
READY_TIMEOUT_S = 180
CHIEF_TIMEOUT_S = 400
#: Kubernetes' default terminationGracePeriodSeconds: SIGKILL follows SIGTERM after it.
GRACE_S = 30
#: The operator's order of replica types does not matter to TF; servers start before the chief.
SERVING = ("PS", "Worker")


def manifest():
    with open(EXAMPLE / "tfjob.yaml") as f:
        return next(d for d in yaml.safe_load_all(f) if d and d.get("kind") == "TFJob")


def container(replica_spec):
    (c,) = [c for c in replica_spec["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
    return c


def port_named(c, name):
    return next(p["containerPort"] for p in c["ports"] if p["name"] == name)


def service_names(job):
    """{replica type: [the service name of each replica]} as the TFJob operator names them."""
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    return {rtype: [f"{name}-{rtype.lower()}-{i}.{namespace}.svc" for i in range(spec["replicas"])]
            for rtype, spec in job["spec"]["tfReplicaSpecs"].items()}


def tf_config(job, rtype, index):
    """TF_CONFIG as the TFJob operator writes it for replica `index` of type `rtype`."""
    specs = job["spec"]["tfReplicaSpecs"]
    cluster = {rt.lower(): [f"{host}:{port_named(container(specs[rt]), 'tfjob-port')}"
                            for host in hosts]
               for rt, hosts in service_names(job).items()}
    return json.dumps({"cluster": cluster, "task": {"type": rtype.lower(), "index": index},
                       "environment": "cloud"})


def image_files():
    """{path in the image: path in this checkout} from the Dockerfile's COPY lines."""
    files = {}
    for line in (EXAMPLE / "Dockerfile").read_text().splitlines():
        words = shlex.split(line) if line.startswith("COPY ") else []
        if words and not any(w.startswith("--") for w in words):
            files[words[2]] = str(ROOT / words[1])
    return files


def argv_in_image(command):
    """The container's command as this checkout runs it (see the module's docstring)."""
    files = image_files()
    head = {"python3": [sys.executable], "rdmadev": [sys.executable, "-m", "rdmadev"]}
    return head.get(command[0], [command[0]]) + [files.get(a, a) for a in command[1:]]


def pod_env(c, job, rtype, index, secret_values):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret_values[(ref["name"], ref["key"])]
    env["TF_CONFIG"] = tf_config(job, rtype, index)
    return env


def start_pod(pods, name, argv, env, log):
    # A pid namespace of the pod's own: the command is its pid 1, as in a container.
    cmd = pods.command(name, ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"]
                       + argv)
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_ready(proc, log_path, deadline):
    while time.monotonic() < deadline:
        text = Path(log_path).read_text()
        if READY_MARKER in text:
            return
        assert proc.poll() is None, f"the pod's task exited ({proc.returncode}):\n{text[-3000:]}"
        time.sleep(0.5)
    pytest.fail(f"not serving after {READY_TIMEOUT_S} s:\n{Path(log_path).read_text()[-3000:]}")


def test_the_manifest_declares_the_control_port_rdmadev_listens_on():
    job = manifest()
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        c = container(spec)
        env = {v["name"]: v["value"] for v in c.get("env", []) if "value" in v}
        offset = Config.from_env(env).control_port_offset
        assert port_named(c, "rdmadev-ctl") == port_named(c, "tfjob-port") + offset, rtype
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"], rtype
    for path in image_files().values():
        assert os.path.exists(path), f"the Dockerfile copies {path}, which does not exist"


@pytest.mark.slow
@pytest.mark.tf
def test_a_tfjob_trains_over_rdmadev_and_its_pods_end_on_sigterm(tmp_path):
    netns.require("unshare")
    job = manifest()
    specs = job["spec"]["tfReplicaSpecs"]
    names = service_names(job)
    secrets_ = {}
    for c in (container(s) for s in specs.values()):
        for var in c.get("env", []):
            if "valueFrom" in var:
                ref = var["valueFrom"]["secretKeyRef"]
                secrets_[(ref["name"], ref["key"])] = secrets.token_hex(16)
    all_names = [n for rt in specs for n in names[rt]]
    with pods_mod.Pods("rdk", all_names) as pods:
        serving = {}
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            for rtype in SERVING:
                c = container(specs[rtype])
                for i, name in enumerate(names[rtype]):
                    log_path = tmp_path / f"{name}.log"
                    with open(log_path, "w") as log:
                        serving[name] = (start_pod(pods, name, argv_in_image(c["command"]),
                                                   pod_env(c, job, rtype, i, secrets_), log),
                                         log_path)
            for name, (proc, log_path) in serving.items():
                wait_ready(proc, log_path, deadline)

            c = container(specs["Chief"])
            chief = subprocess.run(pods.command(names["Chief"][0], argv_in_image(c["command"])),
                                   env=pod_env(c, job, "Chief", 0, secrets_), capture_output=True,
                                   text=True, timeout=CHIEF_TIMEOUT_S)
            out = chief.stdout + chief.stderr
            assert chief.returncode == 0, out[-4000:]
            steps = c["command"][c["command"].index("--steps") + 1]
            assert f"trained {steps} steps on {len(names['Worker'])} workers over grpc+rdmadev" in out, out
            for rtype in SERVING:
                for i in range(len(names[rtype])):
                    task = f"/job:{rtype.lower()}/replica:0/task:{i}"
                    line = next((l for l in out.splitlines() if l.startswith(f"rdmadev on {task}:")), "")
                    assert line and int(line.split(": ")[1].split()[0]) > 0, \
                        f"{task} carried nothing through rdmadev:\n{out}"

            # The operator deletes the serving pods: SIGTERM to pid 1, SIGKILL after the grace.
            for proc, _ in serving.values():
                os.killpg(proc.pid, signal.SIGTERM)
            for name, (proc, log_path) in serving.items():
                try:
                    code = proc.wait(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{name} still runs {GRACE_S} s after SIGTERM: Kubernetes would "
                                f"SIGKILL it\n{Path(log_path).read_text()[-2000:]}")
                assert code == 0, f"{name} ended {code} on SIGTERM:\n{Path(log_path).read_text()[-2000:]}"
                text = Path(log_path).read_text()
                assert "Traceback" not in text, text[-3000:]
        finally:
            for proc, _ in serving.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
