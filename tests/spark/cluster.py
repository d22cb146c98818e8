"""A Spark standalone cluster on the loopback address, started and stopped by a test.

:func:`standalone_cluster` starts a master and ``n_workers`` workers as separate JVM processes
(pyspark's bundled ``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``),
every one bound to 127.0.0.1 (``--host``, ``SPARK_LOCAL_IP``) on free ports, waits until the
master's JSON page lists every worker ALIVE, yields a :class:`Cluster` (``cluster.url`` is
``spark://127.0.0.1:PORT``) and always stops every process it started: the daemons and what they
spawned (executor JVMs, pyspark's Python daemons and workers). Each of those carries a marker in
its environment (:data:`MARKER`, one value per cluster, inherited by every descendant), so the
stop finds them by pid whatever their process group, and :meth:`Cluster.survivors` lists any left.

Nothing here skips: no Java or no pyspark is an error naming what is missing (both are part of
the stack; CI must not pass by not running the test).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: Environment variable set to one value per cluster in each process it starts (and thereby in
#: every descendant): how :meth:`Cluster.processes` finds them.
MARKER = "CALPIPE_TEST_SPARK_CLUSTER"
HOST = "127.0.0.1"


def spark_home() -> Path:
    """pyspark's bundled Spark (``bin/spark-class``, ``jars/``): an ImportError without pyspark."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise RuntimeError(f"pyspark at {home} has no bin/spark-class")
    return home


def java() -> str:
    """The java binary Spark will run (``JAVA_HOME``'s, else the PATH's); an error if none."""
    home = os.environ.get("JAVA_HOME")
    exe = Path(home, "bin", "java") if home else shutil.which("java")
    if not exe or not Path(exe).is_file():
        raise RuntimeError(
            "no java: a Spark standalone cluster needs Java 17 (JAVA_HOME or java on the PATH)"
        )
    return str(exe)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a daemon's child before exec: SIGTERM it when the process that started it dies (a
    test run killed outright leaves no cluster behind; a worker stops its executors)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _marked(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie is already dead
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _sockets(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _listen_table() -> dict[str, tuple[str, int]]:
    """Every TCP socket (v4 and v6) in LISTEN state: inode -> (address, port), IPv4-mapped IPv6
    shown as IPv4."""
    out = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":  # LISTEN
                    addr, port = f[1].split(":")
                    out[f[9]] = (_address(addr, v6), int(port, 16))
    return out


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """The TCP addresses on which the processes ``pids`` listen, as ``(address, port)``."""
    table = _listen_table()
    return {table[i] for pid in pids for i in _sockets(pid) if i in table}


def _address(hexaddr: str, v6: bool) -> str:
    raw = bytes.fromhex(hexaddr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc prints an IPv6 address as four host-order 32-bit words
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


@dataclass
class Watch:
    """What :meth:`Cluster.watch` saw, sampled twice a second: ``listening``, every TCP
    address a process of the cluster listened on (with the process's command line), and
    ``python``, every Python process of the cluster (pyspark's daemons and workers) with its
    interpreter and ``NUMBA_CACHE_DIR``."""

    listening: dict[tuple[str, int], str] = field(default_factory=dict)
    python: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)

    def sample(self, pids: list[int]) -> None:
        table = _listen_table()
        for pid in pids:
            if pid not in self.commands:
                self.commands[pid] = _cmdline(pid)
            if pid not in self.python and "pyspark" in self.commands[pid]:
                argv0 = self.commands[pid].split(" ", 1)[0]
                if "python" in Path(argv0).name:
                    self.python[pid] = (argv0, _environ(pid).get("NUMBA_CACHE_DIR"))
            for inode in _sockets(pid):
                if inode in table:
                    self.listening.setdefault(table[inode], self.commands[pid])

    def executors(self) -> list[str]:
        """The command lines of the executor JVMs seen."""
        return [c for c in self.commands.values() if "CoarseGrainedExecutorBackend" in c]


@dataclass
class Cluster:
    """A running standalone cluster: ``url`` (``spark://127.0.0.1:PORT``), the master's web UI
    ``ui`` (``http://127.0.0.1:PORT``), the folder of its logs and work directories."""

    url: str
    ui: str
    root: Path
    marker: str
    daemons: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def state(self) -> dict:
        """The master's JSON page (workers, applications, cores in use)."""
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as r:
            return json.load(r)

    def processes(self) -> list[int]:
        """Pids of every live process of the cluster: the daemons and their descendants."""
        return _marked(self.marker)

    def survivors(self) -> list[str]:
        """The cluster's processes still alive (``pid cmdline``): none after :meth:`stop`."""
        return [f"{p} {_cmdline(p)}" for p in self.processes()]

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver process run against the cluster (``calpipe spark-run``):
        bound to 127.0.0.1 (the driver's RPC and block manager; its web UI is off in
        :func:`calpipe.spark.session`), marked as the cluster's (:meth:`processes` counts it and
        its JVM, :meth:`stop` ends them if they are left)."""
        return {
            **os.environ, "SPARK_LOCAL_IP": HOST, "SPARK_LOCAL_HOSTNAME": HOST,
            MARKER: self.marker, **extra,
        }  # fmt: skip

    @contextlib.contextmanager
    def watch(self, every: float = 0.5) -> Iterator[Watch]:
        """Record what the cluster's processes do while the block runs (:class:`Watch`), every
        ``every`` seconds (a sample reads /proc: a few tens of ms on this sandbox)."""
        w = Watch()
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                w.sample(self.processes())
                stop.wait(every)

        t = threading.Thread(target=loop, name="spark-cluster-watch", daemon=True)
        t.start()
        try:
            yield w
        finally:
            stop.set()
            t.join()

    def log_tail(self, n: int = 30) -> str:
        parts = []
        for log in self.logs:
            with contextlib.suppress(OSError):
                lines = log.read_text(errors="replace").splitlines()[-n:]
                parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the workers, then the master (SIGTERM: a worker kills its executors, whose
        Python daemons exit with them), SIGKILL every process of the cluster still alive after
        ``timeout`` seconds, and reap the daemons."""
        for group in (self.daemons[1:], self.daemons[:1]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=timeout / 2)
        deadline = time.monotonic() + timeout / 2
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(50):
            left = self.processes()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for p in self.daemons:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def _wait_for(cluster: Cluster, n_workers: int, deadline: float) -> None:
    """Until the master's JSON page answers and lists ``n_workers`` ALIVE workers; an error
    with the logs if a daemon exits or the ``deadline`` (of ``time.monotonic``) passes."""
    seen = None
    while time.monotonic() < deadline:
        dead = [p for p in cluster.daemons if p.poll() is not None]
        if dead:
            raise RuntimeError(
                f"Spark daemon exited with code {dead[0].returncode}: {' '.join(dead[0].args)}\n"
                + cluster.log_tail()
            )
        with contextlib.suppress(OSError, ValueError):
            seen = cluster.state()
            alive = [w for w in seen.get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= n_workers:
                return
        time.sleep(0.25)
    raise RuntimeError(
        f"Spark master {cluster.url}: not up with {n_workers} registered worker(s) in time "
        f"(master says {seen})\n" + cluster.log_tail()
    )


@contextlib.contextmanager
def standalone_cluster(
    root: Path,
    *,
    n_workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    daemon_memory: str = "256m",
    timeout: float = 240.0,
) -> Iterator[Cluster]:
    """A master and ``n_workers`` workers (``cores`` cores, ``memory`` for executors each) on
    127.0.0.1, logs and work directories under ``root``; every process stopped on exit, also on
    an error (a failed start included). ``daemon_memory``: the master's and workers' own heaps;
    ``timeout``: seconds until all are up (a JVM starts in a few seconds on an idle machine, in
    a minute on a busy one)."""
    home = spark_home()
    java_exe = java()
    root.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    props = root / "spark-daemons.conf"
    # no REST submission server (a port more), no reverse proxy through the master, and a port
    # taken meanwhile is an error (not the next port up, where the workers would not look)
    props.write_text(
        "spark.master.rest.enabled false\nspark.ui.reverseProxy false\nspark.port.maxRetries 0\n"
    )
    # the daemons' environment: the driver's Python settings left out (an application hands
    # its executors the interpreter and the numba cache, as on a real cluster)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.pop("NUMBA_CACHE_DIR", None)
    env.update({
        "SPARK_HOME": str(home),
        "JAVA_HOME": str(Path(java_exe).resolve().parent.parent),
        "SPARK_LOCAL_IP": HOST,  # every socket the daemons (and their executors) bind
        "SPARK_LOCAL_HOSTNAME": HOST,  # the address they advertise
        "SPARK_DAEMON_MEMORY": daemon_memory,
        "SPARK_CONF_DIR": str(root),  # no spark-defaults.conf or spark-env.sh from elsewhere
        "SPARK_LOG_DIR": str(root),
        MARKER: marker,
    })  # fmt: skip
    port, ui_port = free_port(), free_port()
    cluster = Cluster(f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}", root, marker)
    spark_class = str(home / "bin" / "spark-class")

    def start(name: str, *args: str) -> None:
        log = root / f"{name}.log"
        cluster.logs.append(log)
        cmd = [spark_class, *args, "--properties-file", str(props)]
        with open(log, "wb") as out:
            p = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        cluster.daemons.append(p)

    try:
        deadline = time.monotonic() + timeout
        start("master", "org.apache.spark.deploy.master.Master",
              "--host", HOST, "--port", str(port), "--webui-port", str(ui_port))  # fmt: skip
        # the workers once the master answers: a worker that finds no master retries only
        # after 5 to 15 s, then after a minute
        _wait_for(cluster, 0, deadline)
        for i in range(n_workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", cluster.url,
                  "--host", HOST, "--port", str(free_port()), "--webui-port", str(free_port()),
                  "--cores", str(cores), "--memory", memory, "--work-dir", str(work))  # fmt: skip
        _wait_for(cluster, n_workers, deadline)
        yield cluster
    finally:
        cluster.stop()
