"""A Spark standalone cluster with a SECOND NODE: one worker on this host and one inside a network
namespace of its own, with its own address on a private /24 (a veth pair), its own file system (a tmpfs over
the directory that holds the tier-1 root) into which only the tier-1 root is bind-mounted, like an NFS mount at
the same path; PostgreSQL and RGW reached over the veth (a forwarder inside the namespace listens on the
loopback addresses the settings name and sends the bytes across to a forwarder on the host side, which
reaches the real services). The master and the driver listen on the host's veth address, which both workers
reach. Needs root and iproute2; `start` raises Unavailable with the reason otherwise (the tier then skips,
saying so).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


class Unavailable(RuntimeError):
    """Network namespaces cannot be made here."""


@dataclass
class TwoNodes:
    ns: str
    host_ip: str  # the host side of the veth pair: master, driver, host worker, host forwarders
    node_ip: str  # the second node
    master_url: str
    ui_url: str
    event_dir: Path
    conf_dir: Path
    state_dir: Path
    tier1_root: Path
    pgids: dict = field(default_factory=dict)  # name -> process group id

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return json.load(r)

    def kill_remote_worker(self) -> None:
        """The second node dies: its worker, its executors and their Python workers, at once."""
        _killpg(self.pgids.pop("remote-worker"), signal.SIGKILL)


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise Unavailable(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _spark_class() -> str:
    return str(Path(sys.executable).parent / "spark-class")


def start(state_dir: Path, tier1_root: Path, database_url: str, s3_endpoint: str, timeout: float = 120) -> TwoNodes:
    if os.geteuid() != 0:
        raise Unavailable("not root: network namespaces need CAP_SYS_ADMIN")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        raise Unavailable("iproute2's `ip` or util-linux's `unshare` is not installed")
    tag = f"{os.getpid() % 100000}"
    subnet = 10 + os.getpid() % 240
    ns, veth_host, veth_node = f"tiering-{tag}", f"vth{tag}", f"vtn{tag}"
    host_ip, node_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    nodes = TwoNodes(ns, host_ip, node_ip, "", "", state_dir / "events", state_dir / "conf", state_dir, tier1_root)
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth_host, "type", "veth", "peer", "name", veth_node)
        _run("ip", "link", "set", veth_node, "netns", ns)
        _run("ip", "addr", "add", f"{host_ip}/24", "dev", veth_host)
        _run("ip", "link", "set", veth_host, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{node_ip}/24", "dev", veth_node)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", veth_node, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _start_processes(nodes, database_url, s3_endpoint, timeout)
    except BaseException:
        stop(nodes)
        raise
    return nodes


def _start_processes(nodes: TwoNodes, database_url: str, s3_endpoint: str, timeout: float) -> None:
    state, host_ip, node_ip = nodes.state_dir, nodes.host_ip, nodes.node_ip
    for d in (state, nodes.event_dir, nodes.conf_dir):
        d.mkdir(parents=True, exist_ok=True)
    # the driver (spark-submit under Airflow, on this host) listens where both workers reach it; the
    # scheduler waits for both executors, so both nodes get tasks
    (nodes.conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{nodes.event_dir}\n"
        f"spark.eventLog.compress false\nspark.eventLog.rolling.enabled false\n"
        f"spark.driver.host {host_ip}\nspark.driver.bindAddress {host_ip}\n"
        f"spark.cores.max 2\nspark.scheduler.minRegisteredResourcesRatio 1.0\n"
        f"spark.scheduler.maxRegisteredResourcesWaitingTime 15s\n")
    pg, s3 = urlsplit(database_url), urlsplit(s3_endpoint)
    pg_port, s3_port = pg.port or 5432, s3.port or (443 if s3.scheme == "https" else 80)
    fw_pg, fw_s3 = free_port(host_ip), free_port(host_ip)
    py = sys.executable
    env = {**os.environ, "SPARK_CONF_DIR": str(nodes.conf_dir), "SPARK_DAEMON_MEMORY": "256m",
           "PATH": f"{Path(py).parent}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}

    def launch(name: str, cmd: list[str], extra: dict | None = None, ready: str | None = None) -> None:
        log = open(state / f"{name}.log", "ab")
        proc = subprocess.Popen(cmd, env={**env, **(extra or {})}, stdout=subprocess.PIPE if ready else log,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
        nodes.pgids[name] = proc.pid
        if ready:
            line = proc.stdout.readline().decode().strip()
            if line != ready:
                raise Unavailable(f"{name} did not start: {line!r}; {(state / f'{name}.log').read_text()[-500:]}")

    # host side: the veth address -> the real services on loopback
    launch("host-forwarder", [py, "-m", "tests.cluster.tcp_forward",
                              f"{host_ip}:{fw_pg}={pg.hostname}:{pg_port}",
                              f"{host_ip}:{fw_s3}={s3.hostname}:{s3_port}"], ready="READY")
    # node side: the loopback addresses the settings name -> across the veth
    launch("node-forwarder", ["ip", "netns", "exec", nodes.ns, py, "-m", "tests.cluster.tcp_forward",
                              f"{pg.hostname}:{pg_port}={host_ip}:{fw_pg}",
                              f"{s3.hostname}:{s3_port}={host_ip}:{fw_s3}"], ready="READY")
    port, ui = free_port(host_ip), free_port(host_ip)
    nodes.master_url, nodes.ui_url = f"spark://{host_ip}:{port}", f"http://{host_ip}:{ui}"
    launch("master", [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", host_ip, "--port", str(port),
                      "--webui-port", str(ui)], {"SPARK_LOCAL_IP": host_ip})
    (state / "host-worker").mkdir(exist_ok=True)
    launch("host-worker", [_spark_class(), "org.apache.spark.deploy.worker.Worker", nodes.master_url, "--host", host_ip,
                           "--cores", "1", "--memory", "1g", "--webui-port", str(free_port(host_ip)),
                           "--work-dir", str(state / "host-worker")], {"SPARK_LOCAL_IP": host_ip})
    # The second node (2 GiB for executors, the host's 1 GiB: a job asking for more than 1 GiB per executor
    # runs on the second node only). Its own mount namespace where the directory holding the tier-1 root is an empty
    # tmpfs, with only the tier-1 root bind-mounted back at its path (its other files are not there).
    root, parent = nodes.tier1_root, nodes.tier1_root.parent
    stage = state / "stage"
    stage.mkdir(exist_ok=True)
    node_dir = state / "remote-worker"  # outside `parent`: visible on both, as a worker's local disk
    node_dir.mkdir(exist_ok=True)
    script = (f"set -e; mount --make-rprivate /; mount --bind {_q(root)} {_q(stage)}; "
              f"mount -t tmpfs tmpfs {_q(parent)}; mkdir -p {_q(root)}; mount --move {_q(stage)} {_q(root)}; "
              f"exec {_q(_spark_class())} org.apache.spark.deploy.worker.Worker {nodes.master_url} --host {node_ip} "
              f"--cores 1 --memory 2g --webui-port {free_port(host_ip)} --work-dir {_q(node_dir)}")
    launch("remote-worker", ["ip", "netns", "exec", nodes.ns, "unshare", "--mount", "sh", "-c", script],
           {"SPARK_LOCAL_IP": node_ip, "SPARK_PUBLIC_DNS": node_ip})
    deadline = time.monotonic() + timeout
    while True:
        try:
            alive = {w.get("host") for w in nodes.status().get("workers", []) if w.get("state") == "ALIVE"}
            if {host_ip, node_ip} <= alive:
                return
        except (OSError, ValueError):  # not answering yet, or (while its UI starts) a page instead of JSON
            pass
        if time.monotonic() > deadline:
            logs = "".join((state / f"{n}.log").read_text(errors="replace")[-800:] for n in ("master", "remote-worker")
                           if (state / f"{n}.log").exists())
            raise RuntimeError(f"the two-node cluster did not come up in {timeout:.0f} s:\n{logs}")
        time.sleep(0.5)


def _q(p) -> str:
    import shlex

    return shlex.quote(str(p))


def stop(nodes: TwoNodes) -> None:
    """Kill every process group started, then delete the namespace (which deletes the veth pair)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in list(nodes.pgids.values()):
            _killpg(pgid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in nodes.pgids.values()):
            time.sleep(0.2)
    nodes.pgids.clear()
    subprocess.run(["ip", "netns", "delete", nodes.ns], capture_output=True)
    subprocess.run(["ip", "link", "delete", f"vth{nodes.ns.split('-')[-1]}"], capture_output=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def executor_hosts(event_log: Path) -> dict[str, str]:
    """Executor id -> host of every task end recorded in one application's event log."""
    out = {}
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("Event") == "SparkListenerTaskEnd":
            info = event["Task Info"]
            out.setdefault(info["Executor ID"], info["Host"])
    return out
