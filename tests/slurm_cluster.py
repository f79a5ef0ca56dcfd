"""A real Slurm cluster on this host for the tests, one node or several (a helper, not a test file).

``slurm_cluster(tmpdir, nodes=N)`` starts munged, slurmctld and one slurmd per node with every state /
spool / log / pid path under ``tmpdir`` and yields a :class:`SlurmCluster`; on the way out (always,
also on errors and timeouts) it cancels the jobs, stops the daemons (the pids they were started with
and wrote into their pid files) and then kills whatever is left that carries this cluster's
``SLURM_CONF`` in its environment (slurmstepd, job processes), so no process outlives the test.

    with slurm_cluster(tmp_path) as cluster:                # one node: this host
        job = cluster.submit(script, "--time=2", env={"CKPT_DIR": str(ckpt)})
        cluster.wait(job, {"COMPLETED"}, timeout=300)
    with slurm_cluster(tmp_path, nodes=2) as cluster:       # nodes n1, n2, both on this host
        cluster.run("srun", "-N2", "hostname")

Several nodes on one host (field notes, "Two Slurm nodes on one host"): Debian's slurmd takes
``-N NODENAME``, so one daemon per node name, each with its own ``Port=`` on 127.0.0.1,
``NodeHostname=`` this host, and ``%n`` (the node name) in its spool, pid and log paths. Slurm then
schedules, launches and signals across n1, n2, ... exactly as across machines; only the network is
loopback. Each node declares ``CPUs=1`` (honest on a 2-core box: no cgroups enforce it anyway).

The configuration is the one recorded in /work/shared/field-notes.md ("Slurm"): root runs everything
(SlurmUser root), munge with its own key and socket, ``proctrack/linuxproc`` + ``task/none`` (no
cgroups), no accounting database (job state from ``scontrol`` or the ``jobcomp/filetxt`` log),
``cred_expire=10`` so a requeued job starts again within seconds. The node is ``hostname -s`` at
127.0.0.1, the daemons listen on free ports picked at start and bind to that address only
(``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``).

Needs root and Debian's ``slurmctld slurmd slurm-client munge`` (``make test`` as root installs
them); otherwise the tests using it are skipped with :data:`SKIP_REASON`.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from preflight.harness.launch import free_ports

SKIP_REASON = ("Slurm tests need root and Debian's slurmctld slurmd slurm-client munge: run `make test` "
               "as root (it installs them) or apt-get install them")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel", "squeue")
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SBIN))


def missing() -> str | None:
    """Why a cluster cannot start here (None: it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return SKIP_REASON + " (not root)"
    absent = [b for b in BINARIES if _which(b) is None]
    if absent:
        return SKIP_REASON + f" (missing: {' '.join(absent)})"
    return None


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(none)"


def _parse_kv(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value2`` (scontrol -o / jobcomp filetxt) -> dict; values have no spaces there."""
    out = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep:
            out[k] = v
    return out


class SlurmCluster:
    """One running cluster of ``nodes`` nodes on this host; see the module docstring."""

    def __init__(self, root: Path, nodes: int = 1):
        if nodes < 1:
            raise ValueError(f"nodes = {nodes}: at least 1")
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        # one node: this host by its name (as on a workstation); several: n1, n2, ... on this host
        self.nodes = [self.host] if nodes == 1 else [f"n{i}" for i in range(1, nodes + 1)]
        self.node = self.nodes[0]
        self.conf = self.root / "etc" / "slurm.conf"
        self.log_dir = self.root / "log"
        self.run_dir = self.root / "run"
        self.jobcomp = self.root / "jobcomp.log"
        self.ctld_port, *self.slurmd_ports = free_ports(1 + nodes)
        self.slurmd_port = self.slurmd_ports[0]
        self.env = dict(os.environ)
        self.env["PATH"] = os.pathsep.join([self.env.get("PATH", ""), *_SBIN])
        self.env["SLURM_CONF"] = str(self.conf)
        for var in [v for v in self.env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if var != "SLURM_CONF":          # a surrounding job's settings must not leak into ours
                del self.env[var]
        self._procs: dict[str, subprocess.Popen] = {}
        self._jobs: list[str] = []
        self._short_dir: str | None = None
        self.bringup_s: float | None = None

    # ------------------------------------------------------------------ configuration
    def _munge_socket_dir(self) -> Path:
        # a unix socket path has to fit in 108 bytes; pytest's tmp paths can be longer
        d = self.root / "munge"
        if len(str(d / "munge.socket.2")) > 100:
            self._short_dir = tempfile.mkdtemp(prefix="pf-munge-", dir="/tmp")
            d = Path(self._short_dir)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _write_config(self) -> None:
        for d in ("etc", "state", "spool", "log", "run", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        sock_dir = self._munge_socket_dir()
        # munged wants the socket's directories searchable (711) and not writable by others
        for d in (self.root, self.root / "munge", sock_dir):
            os.chmod(d, 0o711)
        self.munge_socket = sock_dir / "munge.socket.2"
        self.munge_key = self.root / "munge" / "munge.key"
        self.munge_key.write_bytes(secrets.token_bytes(1024))
        os.chmod(self.munge_key, 0o400)
        r = self.root
        if len(self.nodes) == 1:
            nodes = self._node_line()
            per_node = (f"SlurmdPort={self.slurmd_port}\nSlurmdSpoolDir={r}/spool\nSlurmdPidFile={r}/run/slurmd.pid\n"
                        f"SlurmdLogFile={r}/log/slurmd.log")
        else:           # %n: the node name, so that each slurmd of this host has its own files
            nodes = "\n".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} CPUs=1 "
                              "State=UNKNOWN" for n, port in zip(self.nodes, self.slurmd_ports))
            per_node = (f"SlurmdSpoolDir={r}/spool-%n\nSlurmdPidFile={r}/run/slurmd-%n.pid\n"
                        f"SlurmdLogFile={r}/log/slurmd-%n.log")
        self.conf.write_text(f"""\
# written by tests/slurm_cluster.py: {len(self.nodes)} node(s) on this host, everything as root, no cgroups,
# no database
ClusterName=preflight
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={r}/state
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmctldLogFile={r}/log/slurmctld.log
{per_node}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
SchedulerParameters=sched_interval=5
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
KillWait=10
{nodes}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")

    def _node_line(self) -> str:
        """``slurmd -C`` (what slurmd will detect) with our name and address; a plain CPUs= line if that fails."""
        try:
            out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30,
                                 env=self.env).stdout
            line = next(ln for ln in out.splitlines() if ln.startswith("NodeName="))
            fields = [f for f in line.split()[1:] if not f.startswith(("RealMemory=", "UpTime="))]
        except (OSError, subprocess.SubprocessError, StopIteration):
            fields = [f"CPUs={os.cpu_count() or 1}"]
        return f"NodeName={self.node} NodeAddr=127.0.0.1 {' '.join(fields)} State=UNKNOWN"

    # ------------------------------------------------------------------ daemons
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.log_dir / f"{name}.stdout", "ab")
        try:
            self._procs[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()

    def _check_alive(self) -> None:
        for name, p in self._procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.diagnostics()}")

    def start(self, timeout: float = 90) -> SlurmCluster:
        t0 = time.monotonic()
        self._write_config()
        # foreground (-F / -D) children: their pids are ours to stop and reap
        self._spawn("munged", [_which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={self.munge_key}", f"--log-file={self.log_dir}/munged.log",
                               f"--pid-file={self.run_dir}/munged.pid",
                               f"--seed-file={self.root}/munge/munged.seed"])
        self._until(lambda: self.munge_socket.exists(), timeout, "munged socket")
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for name in self._slurmd_names():
            node = [] if len(self.nodes) == 1 else ["-N", name.removeprefix("slurmd-")]
            self._spawn(name, [_which("slurmd"), "-D", "-f", str(self.conf), *node])
        self._until(lambda: set(self.node_states().values()) == {"idle"} and len(self.node_states()) == len(self.nodes),
                    timeout - (time.monotonic() - t0), "node idle")
        self.bringup_s = time.monotonic() - t0
        return self

    def _slurmd_names(self) -> list[str]:
        """Our names for the slurmd daemons (and their pid files): slurmd, or slurmd-n1, slurmd-n2, ..."""
        return ["slurmd"] if len(self.nodes) == 1 else [f"slurmd-{n}" for n in self.nodes]

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` from sinfo (idle, allocated, down, ...; {} when slurmctld does not answer)."""
        try:
            r = self.run("sinfo", "-h", "-N", "-o", "%N %T", timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        pairs = (ln.split() for ln in r.stdout.splitlines() if len(ln.split()) == 2)
        return {n: t.rstrip("*~#") for n, t in pairs}

    def _until(self, ok, timeout: float, what: str, every: float = 0.25) -> None:
        deadline = time.monotonic() + max(timeout, 1)
        while True:
            self._check_alive()
            if ok():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm: no {what} after {timeout:.0f} s\n{self.diagnostics()}")
            time.sleep(every)

    def _pids_with_our_conf(self) -> list[int]:
        """Processes whose environment carries this cluster's SLURM_CONF (stepds, job processes)."""
        tag = f"SLURM_CONF={self.conf}".encode()
        me = os.getpid()
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == me:
                continue
            try:
                if tag in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    def stop(self) -> None:
        """Cancel jobs, stop the daemons, kill leftovers. Safe to call twice, never raises."""
        with contextlib.suppress(Exception):
            if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
                # ours by submit(), and any other job of this cluster (e.g. a `sbatch --wait` a test ran)
                queued = self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.split()
                jobs = sorted(set(self._jobs) | set(queued))
                if jobs:
                    self.run("scancel", *jobs, timeout=10)
                deadline = time.monotonic() + 15
                while jobs and time.monotonic() < deadline and any(
                        self.job_state(j) in ("RUNNING", "COMPLETING", "CONFIGURING") for j in jobs):
                    time.sleep(0.5)
        pids = {}
        for name in (*self._slurmd_names(), "slurmctld", "munged"):
            p = self._procs.get(name)
            pid = p.pid if p else None
            with contextlib.suppress(OSError, ValueError):
                pid = pid or int((self.run_dir / f"{name}.pid").read_text().split()[0])
            if pid:
                pids[name] = pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        for name, pid in pids.items():
            p = self._procs.get(name)
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=10)
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for _ in range(3):     # stepds and job processes are not our children: kill by SLURM_CONF tag
            left = self._pids_with_our_conf()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        self._procs.clear()
        if self._short_dir:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None

    # ------------------------------------------------------------------ clients
    def run(self, *argv: str, timeout: float = 60, check: bool = False, env: dict | None = None,
            **kw) -> subprocess.CompletedProcess:
        """A Slurm client command (srun, scontrol, ...) against this cluster."""
        full = dict(self.env, **(env or {}))
        return subprocess.run([_which(argv[0]) or argv[0], *argv[1:]], env=full, capture_output=True,
                              text=True, timeout=timeout, check=check, **kw)

    def submit(self, script_path, *sbatch_args: str, script_args=(), env: dict | None = None,
               timeout: float = 30) -> str:
        """``sbatch [sbatch_args] script [script_args]`` -> job id. ``env`` adds variables to the job."""
        r = self.run("sbatch", "--parsable", *sbatch_args, str(script_path), *map(str, script_args),
                     env=env, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed ({r.returncode}): {r.stderr}\n{self.diagnostics()}")
        job = r.stdout.strip().split(";")[0]
        self._jobs.append(job)
        return job

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict, else the job's last record in the jobcomp log, else {}."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            r = self.run("scontrol", "show", "job", "-o", str(job_id), timeout=15)
            if r.returncode == 0 and "JobState=" in r.stdout:
                return _parse_kv(r.stdout)
        recs = self.jobcomp_records(job_id)
        return recs[-1] if recs else {}

    def jobcomp_records(self, job_id: str | None = None) -> list[dict[str, str]]:
        """The jobcomp/filetxt records (one per finished allocation, requeues included)."""
        try:
            lines = self.jobcomp.read_text(errors="replace").splitlines()
        except OSError:
            return []
        recs = [_parse_kv(ln) for ln in lines if ln.strip()]
        return [d for d in recs if job_id is None or d.get("JobId") == str(job_id)]

    def job_state(self, job_id: str) -> str:
        """RUNNING, PENDING, COMPLETED, FAILED, TIMEOUT, ... ('' when the job is unknown)."""
        return self.job_info(job_id).get("JobState", "")

    def wait(self, job_id: str, states, timeout: float, every: float = 1.0) -> str:
        """Poll until the job's state is one of ``states``; return it. TimeoutError with logs otherwise."""
        states = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        state = ""
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state or 'unknown'} after {timeout:.0f} s "
                                   f"(waited for {sorted(states)})\n{self.diagnostics()}")
            self._check_alive()
            time.sleep(every)

    def diagnostics(self) -> str:
        parts = []
        daemons = ("slurmctld", *self._slurmd_names(), "munged")
        for name in [f"{d}.log" for d in daemons] + [f"{d}.stdout" for d in daemons]:
            p = self.log_dir / name
            if p.exists():
                parts.append(f"--- {name} (tail)\n{_tail(p)}")
        return "\n".join(parts)


@contextlib.contextmanager
def slurm_cluster(tmpdir, timeout: float = 90, nodes: int = 1):
    """Start a cluster of ``nodes`` nodes under ``tmpdir`` (pytest.skip when this machine cannot);
    stop it on exit."""
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(Path(tmpdir), nodes=nodes)
    try:
        cluster.start(timeout=timeout)
        yield cluster
    finally:
        cluster.stop()
