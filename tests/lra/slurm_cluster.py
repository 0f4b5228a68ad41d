"""A real one-node SLURM cluster on this machine, for the tests of the SLURM launcher and to try it by hand.

It runs Debian's packages (``apt-get install slurm-wlm slurmdbd munge mariadb-server-core
mariadb-client-core``) as root, every daemon in the foreground as a child of this process, with all
its state in one temporary folder (``/tmp/lra-slurm-*``, short because it holds Unix sockets):

- ``munged`` with a fresh key: SLURM's authentication;
- ``mariadbd`` and ``slurmdbd``: job accounting, which ``sacct`` reads. submitit polls ``sacct`` for
  the state of its jobs; without accounting every poll prints "Slurm accounting storage is
  disabled" and a warning, and a job that dies without writing its result is never noticed;
- ``slurmctld`` and ``slurmd``: one partition (``debug``) with this machine as its one node (the
  node line is ``slurmd -C``'s, i.e. the machine's CPUs and memory), ``proctrack/linuxproc``,
  ``task/none``, ``select/cons_tres`` scheduling CPUs.

Clients find the cluster through ``SLURM_CONF``. The ports are free ones picked at start, so several
clusters can run side by side. ``stop()`` cancels the jobs left, stops each daemon by its PID and
removes the folder.

By hand::

    sudo python3 tests/lra/slurm_cluster.py    # prints "export SLURM_CONF=...", runs until Ctrl-C
    python3 tests/lra/slurm_cluster.py --packages   # the Debian packages it needs
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = "slurm-wlm slurmdbd munge mariadb-server-core mariadb-client-core"
PROGRAMS = (
    "mungekey",
    "munged",
    "mariadb-install-db",
    "my_print_defaults",
    "mariadbd",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "sacctmgr",
    "sbatch",
    "sacct",
    "scontrol",
    "squeue",
    "scancel",
    "sinfo",
)
# The daemons live in sbin folders, which a user's PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
CLUSTER = "lra-test"
PARTITION = "debug"
START_TIMEOUT_S = 60


def unavailable() -> str | None:
    """Why the cluster cannot start here, or None if it can."""
    if os.geteuid() != 0:
        return "a SLURM cluster's daemons run as root (munged, slurmctld, slurmd); run the tests as root"
    missing = [program for program in PROGRAMS if shutil.which(program, path=SEARCH_PATH) is None]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install {PACKAGES}"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free now (all held at once while they are picked)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class ClusterError(RuntimeError):
    pass


class SlurmCluster:
    """Start with ``start()`` (or ``with SlurmCluster() as cluster``); ``env`` is the clients' environment."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lra-slurm-", dir="/tmp"))
        self.root.chmod(0o755)  # munged requires its socket's folder to be reachable by all
        self.log_dir = self.root / "log"
        self.munge_socket = self.root / "munge.socket"
        self.mysql_socket = self.root / "mysql.sock"
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "PATH": SEARCH_PATH, "SLURM_CONF": str(self.conf)}
        self.daemons: dict[str, subprocess.Popen] = {}

    # -- starting --------------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.log_dir.mkdir()
        # Authentication: a fresh key; munged checks that the key is private.
        key = self.root / "munge.key"
        self.command("mungekey", "--create", f"--keyfile={key}")
        self._daemon(
            "munged",
            "munged",
            "--foreground",
            f"--key-file={key}",
            f"--socket={self.munge_socket}",
            f"--pid-file={self.root / 'munged.pid'}",
            f"--seed-file={self.root / 'munged.seed'}",
        )
        self._wait_for("munged's socket", self.munge_socket.exists)

        # Accounting: a private MariaDB (root logs in through the socket) behind slurmdbd.
        data = self.root / "mysql"
        self.command(
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={data}",
            "--user=root",
            "--auth-root-authentication-method=socket",
            "--skip-test-db",
        )
        self._daemon(
            "mariadbd",
            "mariadbd",
            "--no-defaults",
            f"--datadir={data}",
            f"--socket={self.mysql_socket}",
            "--skip-networking",
            "--user=root",
            f"--pid-file={self.root / 'mariadbd.pid'}",
            # slurmdbd's recommendations (it logs an error below half of them)
            "--innodb-buffer-pool-size=512M",
            "--innodb-lock-wait-timeout=900",
        )
        self._wait_for("mariadbd's socket", self.mysql_socket.exists)

        dbd_port, ctld_port, slurmd_port = free_ports(3)
        host = socket.gethostname().split(".")[0]
        (self.root / "slurmdbd.conf").write_text(self._slurmdbd_conf(dbd_port))
        (self.root / "slurmdbd.conf").chmod(0o600)  # slurmdbd refuses a config others can read
        self.conf.write_text(self._slurm_conf(host, dbd_port, ctld_port, slurmd_port))
        # The MySQL client library finds a "localhost" server's socket through MYSQL_UNIX_PORT.
        self._daemon("slurmdbd", "slurmdbd", "-D", env={**self.env, "MYSQL_UNIX_PORT": str(self.mysql_socket)})
        self._wait_for("slurmdbd", lambda: self._accepts(dbd_port))
        self.command("sacctmgr", "--immediate", "add", "cluster", CLUSTER)

        (self.root / "state").mkdir()
        (self.root / "spool").mkdir()
        self._daemon("slurmctld", "slurmctld", "-D", "-i")
        self._wait_for("slurmctld", lambda: self.command("scontrol", "ping", check=False).returncode == 0)
        self._daemon("slurmd", "slurmd", "-D", "-N", host)
        self._wait_for(
            "the node to be idle",
            lambda: self.command("sinfo", "--noheader", "--format=%T", check=False).stdout.strip() == "idle",
        )

    def _node_line(self, host: str) -> str:
        # "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
        hardware = self.command("slurmd", "-C").stdout.splitlines()[0].split()
        return " ".join([f"NodeName={host}", "NodeAddr=127.0.0.1", *hardware[1:], "State=UNKNOWN"])

    def _slurm_conf(self, host: str, dbd_port: int, ctld_port: int, slurmd_port: int) -> str:
        root = self.root
        return f"""\
ClusterName={CLUSTER}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
# slurmstepd, which runs each job, logs here too (the other daemons log to their output)
SlurmdLogFile={self.log_dir / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
# The time between SIGTERM and SIGKILL when a job is cancelled or requeued
KillWait=10
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
# What this cluster's programs authenticate to slurmdbd with: munged's socket
AccountingStoragePass={self.munge_socket}
JobAcctGatherType=jobacct_gather/none
{self._node_line(host)}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _slurmdbd_conf(self, dbd_port: int) -> str:
        return f"""\
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
PidFile={self.root / "slurmdbd.pid"}
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
"""

    def _daemon(self, name: str, *command: str, env: dict[str, str] | None = None) -> None:
        # A daemon in the foreground logs to its output: log/<name>.log (slurmd's output repeats
        # its log file, log/slurmd.log, so it goes to slurmd.out, shown only if there is no log).
        output_path = self.log_dir / (f"{name}.out" if name == "slurmd" else f"{name}.log")
        with open(output_path, "wb") as output:
            self.daemons[name] = subprocess.Popen(
                command,
                env=env or self.env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal reaches stop(), not the daemons
            )

    def _wait_for(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            exited = {name: daemon.returncode for name, daemon in self.daemons.items() if daemon.poll() is not None}
            if exited or time.monotonic() > deadline:
                reason = f"exited: {exited}" if exited else f"not ready after {START_TIMEOUT_S} s"
                raise ClusterError(f"waiting for {what}: {reason}\n{self.logs()}")
            time.sleep(0.2)

    @staticmethod
    def _accepts(port: int) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    # -- using -----------------------------------------------------------------------------------

    def command(self, *command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a client program (``scontrol``, ``sacct``, ...) against this cluster."""
        process = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and process.returncode != 0:
            raise ClusterError(f"{' '.join(command)} exited {process.returncode}:\n{process.stdout}{process.stderr}")
        return process

    def jobs(self) -> list[str]:
        """The ids of the jobs in the queue (pending, running or completing)."""
        return self.command("squeue", "--noheader", "--format=%i").stdout.split()

    def logs(self, lines: int = 25) -> str:
        """The last lines of every daemon's log, to show beside a failure."""
        parts = []
        paths = sorted(self.log_dir.glob("*.log"))
        if not (self.log_dir / "slurmd.log").exists():
            paths += self.log_dir.glob("slurmd.out")
        for path in paths:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                parts.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- stopping --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel the jobs left, stop the daemons (the last started first) and remove the folder."""
        if "slurmd" in self.daemons and self.daemons["slurmd"].poll() is None:
            try:
                jobs = self.jobs()
                if jobs:
                    self.command("scancel", *jobs, check=False)
                    deadline = time.monotonic() + 30
                    while self.jobs() and time.monotonic() < deadline:
                        time.sleep(0.5)
            except (ClusterError, subprocess.TimeoutExpired):
                pass  # the daemons are stopped below all the same
        for daemon in reversed(list(self.daemons.values())):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        self.daemons.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def main() -> None:
    if sys.argv[1:] == ["--packages"]:  # what .ci/run installs
        print(PACKAGES)
        return
    reason = unavailable()
    if reason:
        sys.exit(f"Cannot start a SLURM cluster: {reason}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even when started in the background
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the cluster on kill too
    with SlurmCluster() as cluster:
        print(
            f"A one-node SLURM cluster is up ({cluster.root}). In another shell:\n\n"
            f"    export SLURM_CONF={cluster.conf}\n    sinfo\n\nCtrl-C stops it and removes {cluster.root}.",
            flush=True,
        )
        try:
            signal.pause()
        except KeyboardInterrupt:
            print("\nStopping the cluster", flush=True)


if __name__ == "__main__":
    main()
