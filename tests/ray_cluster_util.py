"""A real multi-node Ray cluster on this machine for tests: `ray start --head` plus worker nodes.

Every node is a `ray start --block` process of its own (its raylet, object store and agents are its
children). The cluster lives in its own temp dir, so its address file never makes another process's plain
`ray.init()` join it, and the drivers find it through ``RAY_ADDRESS`` (as `executor: {address: auto}` does).

`stop` ends exactly the processes this cluster started, by process id: the `ray start` processes, their
descendants, and every process that carries this cluster's marker in its environment (a worker whose raylet
died is re-parented, the marker still finds it). Plain `ray stop` is not used: it ends every Ray process on
the machine, including the clusters of other test runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "COLLAPSE_HPO_TEST_CLUSTER"
# Node-failure detection in seconds instead of the default half minute (read by the head's GCS).
FAST_HEALTH_CHECK = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
                     "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}
#: How long a joining node's `ray start` waits for the GCS to register its raylet (Ray's default is 10 s).
#: On a loaded 2-core machine a second node once gave up with "GCS cannot find the node ... Try increase the
#: RAY_raylet_start_wait_time_s config" (a fresh-clone run, 2026-12-05); the test is about losing a node, not
#: about how fast one joins.
SLOW_NODE_START = {"RAY_raylet_start_wait_time_s": "120"}
#: How long ``wait_nodes`` waits by default: longer than a joining node's own registration wait, twice (it
#: is started again once when it gives up, ``_check_alive``), plus slack. A shorter wait (90 s) ended a
#: fresh-clone run (2026-12-05) with "only 1 of 2 Ray nodes came up" while the second node was still inside
#: its 120 s registration wait, before it could give up and be started again. It returns as soon as the
#: nodes are up.
NODE_WAIT_S = 2 * float(SLOW_NODE_START["RAY_raylet_start_wait_time_s"]) + 30


def free_port() -> int:
    """A TCP port that is free right now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_children() -> dict[int, list[int]]:
    """Parent pid -> child pids, read from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first)."""
    children = _proc_children()
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def _pids_with_marker(value: str) -> list[int]:
    """Processes of this user whose environment holds ``MARKER=value``."""
    needle = f"{MARKER}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass
class Node:
    """One `ray start --block` process and what it was started with."""

    name: str
    process: subprocess.Popen[bytes]
    resources: dict[str, float]
    log: Path
    args: list[str] = field(default_factory=list)  # the `ray start` arguments after the common ones
    restarted: bool = False

    def raylet_pid(self) -> int:
        """The pid of this node's raylet; RuntimeError if it is not running."""
        for pid in descendants(self.process.pid):
            if _comm(pid) == "raylet":
                return pid
        raise RuntimeError(f"node {self.name}: no raylet among the children of `ray start` "
                           f"(pid {self.process.pid}); its log: {self.log}")


@dataclass
class LocalRayCluster:
    """A head node and worker nodes on 127.0.0.1, each a real raylet, sharing one temp dir ``root``."""

    root: Path
    port: int = field(default_factory=free_port)
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    nodes: list[Node] = field(default_factory=list)
    #: Ports handed out so far: ``free_port`` frees its socket at once, so the OS may hand the same port out
    #: again before a node binds it (a CI run saw the GCS port given to the head's dashboard agent too).
    taken: set[int] = field(default_factory=set)

    def fresh_port(self) -> int:
        """A port free right now that this cluster has not handed out before (nor its GCS port)."""
        self.taken.add(self.port)
        while (port := free_port()) in self.taken:
            pass
        self.taken.add(port)
        return port

    @property
    def address(self) -> str:
        """The GCS address drivers connect to (``RAY_ADDRESS``)."""
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment of the cluster's processes and of drivers that should find it."""
        return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": self.address, MARKER: self.marker,
                "RAY_USAGE_STATS_ENABLED": "0", **FAST_HEALTH_CHECK, **SLOW_NODE_START}

    def _ray(self) -> str:
        return str(Path(sys.executable).with_name("ray"))

    def _start(self, name: str, args: list[str], resources: dict[str, float]) -> Node:
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
        cmd = [self._ray(), "start", "--block", "--disable-usage-stats", f"--temp-dir={self.root}",
               "--node-ip-address=127.0.0.1",
               "--object-store-memory", str(100 * 1024**2), *args]
        for flag in ports:
            cmd += [flag, str(self.fresh_port())]
        if resources:
            cmd += ["--resources", json.dumps(resources)]
        log = self.root / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env(),
                                    start_new_session=True)
        node = Node(name, proc, resources, log, list(args))
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: int) -> Node:
        """`ray start --head` with ``num_cpus`` CPUs (no dashboard)."""
        return self._start("head", ["--head", f"--port={self.port}", f"--num-cpus={num_cpus}",
                                    "--include-dashboard=false"], {})

    def add_node(self, name: str, num_cpus: int, resources: dict[str, float]) -> Node:
        """`ray start --address=<head>` with ``num_cpus`` CPUs and the custom ``resources`` label."""
        return self._start(name, [f"--address={self.address}", f"--num-cpus={num_cpus}"], resources)

    def wait_nodes(self, count: int, timeout: float = NODE_WAIT_S) -> list[dict[str, Any]]:
        """Wait until ``count`` nodes are alive; return them as ``{"id", "resources"}`` (a short-lived driver
        asks the cluster, so this process never joins it)."""
        code = (
            "import json, sys, time, ray\n"
            "ray.init(address='auto', logging_level='ERROR', log_to_driver=False)\n"
            f"deadline = time.time() + {timeout}\n"
            "while True:\n"
            "    alive = [n for n in ray.nodes() if n['Alive']]\n"
            f"    if len(alive) >= {count} or time.time() > deadline:\n"
            "        break\n"
            "    time.sleep(0.5)\n"
            "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} for n in alive]))\n"
        )
        with open(self.root / "wait_nodes.log", "w+") as err:
            probe = subprocess.Popen([sys.executable, "-c", code], env=self.env(), stdout=subprocess.PIPE,
                                     stderr=err, text=True)
            try:
                while probe.poll() is None:
                    self._check_alive()
                    time.sleep(0.5)
                stdout = probe.stdout.read() if probe.stdout else ""
            finally:
                if probe.poll() is None:
                    probe.kill()
                probe.wait()
            err.seek(0)
            if probe.returncode != 0:
                raise RuntimeError(f"could not reach the cluster at {self.address}: {err.read()[-2000:]}")
        nodes = json.loads(stdout.strip().splitlines()[-1])
        if len(nodes) < count:
            raise RuntimeError(f"only {len(nodes)} of {count} Ray nodes came up in {timeout} s; logs in "
                               f"{self.root}")
        return nodes

    def _check_alive(self) -> None:
        """RuntimeError with the end of its log when a node's `ray start` has exited. A worker node that gave
        up while registering with the GCS (Ray's own start-up timeout, seen once on a loaded 2-core machine)
        is started again, once."""
        for i, node in enumerate(list(self.nodes)):
            if node.process.poll() is not None and not node.restarted and "--head" not in node.args:
                text = node.log.read_text(errors="replace")
                if "GCS cannot find the node" in text or "timed out during startup" in text:
                    self.nodes.remove(node)
                    again = self._start(f"{node.name}-again", node.args, node.resources)
                    again.restarted = True
                    self.nodes.remove(again)
                    self.nodes.insert(i, again)
                    continue
            if node.process.poll() is not None:
                raise RuntimeError(f"node {node.name}: `ray start` exited ({node.process.returncode}); "
                                   f"end of {node.log}: {node.log.read_text(errors='replace')[-2000:]}")

    def kill_node(self, node: Node) -> list[int]:
        """SIGKILL the raylet of ``node`` and every process under it (its workers): a machine that dies
        takes its trials with it at once. Killing the raylet alone leaves a worker alive for a moment, long
        enough to finish a short trial. Returns the pids killed."""
        pid = node.raylet_pid()
        victims = [pid, *descendants(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        return victims

    def own_pids(self) -> list[int]:
        """Every live process of this cluster: the `ray start` processes, their descendants, and whatever
        carries the cluster's marker (Ray hands its environment down to the GCS, raylets, agents and
        workers; a process title set later may hide it, the process tree then still finds the process)."""
        pids: set[int] = set(_pids_with_marker(self.marker))
        for node in self.nodes:
            if node.process.poll() is None:
                pids.add(node.process.pid)
            pids.update(descendants(node.process.pid))
        return sorted(p for p in pids if not _is_zombie(p))

    def stop(self, grace: float = 10.0) -> list[int]:
        """End this cluster: SIGTERM each `ray start` (it stops its node), then SIGKILL whatever of the
        cluster still lives after ``grace`` s. A process is killed only if it is the very one seen before
        (same pid and start time), so a pid reused meanwhile is never hit. Returns the pids still alive at
        the end (normally none)."""
        seen = {pid: _start_time(pid) for pid in self.own_pids()}
        for node in reversed(self.nodes):
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for node in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        seen.update({pid: _start_time(pid) for pid in self.own_pids()})
        for pid, started in seen.items():
            if started is not None and _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=5)
        time.sleep(0.5)
        return [p for p in seen if _start_time(p) == seen[p] and not _is_zombie(p)] + [
            p for p in self.own_pids() if p not in seen]


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
