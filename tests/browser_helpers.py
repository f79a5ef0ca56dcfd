"""Shared pieces of the browser tests (tests/test_browser.py): Debian's chromium driven by playwright,
a JupyterLab server started (and fully stopped) by the test, and the readout parsing.

Never ``playwright install``: it downloads a browser. The tests use the system chromium at
``/usr/bin/chromium`` (``make test`` installs it as root) and skip with a reason when it or the python
``playwright`` package is missing.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from itertools import product
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
HOW_TO_ENABLE = "run `make test` as root (installs Debian's chromium) or apt-get install chromium"
ARTIFACTS = REPO / ".pytest_cache" / "artifacts"          # ignored by git (pytest's cache folder)


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"no {CHROMIUM}: {HOW_TO_ENABLE}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"python playwright missing (pip install -e '.[test]'); for chromium: {HOW_TO_ENABLE}"
    return None


@contextmanager
def browser():
    """A headless chromium (the system one) for the duration of the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def keep_artifact(path: Path) -> Path:
    """Copy a test artifact (screenshot) next to pytest's cache, where it survives the tmp dir; print it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dst = ARTIFACTS / path.name
    shutil.copy2(path, dst)
    print(f"\nartifact: {path}\n          {dst}")
    return dst


class RequestLog:
    """Route every request of a page: allow the ``allowed`` URL prefixes, abort (and remember) the
    rest; count failed requests too."""

    def __init__(self, page, allowed: tuple[str, ...]):
        self.allowed, self.blocked, self.failed, self.allowed_seen = allowed, [], [], 0
        page.route("**/*", self._route)
        page.on("requestfailed", lambda r: self.failed.append((r.url[:200], r.failure)))

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.allowed):
            self.allowed_seen += 1
            route.continue_()
        else:
            self.blocked.append(url[:200])
            route.abort()

    def unexpected_failures(self) -> list:
        """Failed requests other than the ones we aborted ourselves (and other than cancelled
        long-polls of a page being closed)."""
        blocked = set(self.blocked)
        return [(u, f) for u, f in self.failed if u not in blocked and "ERR_ABORTED" not in (f or "")]


# -- numbers shown in the page ----------------------------------------------------------------------

_NUM = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:e[-+]?\d+)?", re.I)


def number(text: str) -> float:
    """The first number in ``text`` ("9.95x", "1,234.5 GiB", "7e+09", "12.3%") as a float; a percent
    sign divides by 100."""
    m = _NUM.search(text)
    assert m, f"no number in {text!r}"
    x = float(m.group().replace(",", ""))
    return x / 100 if text[m.end():].lstrip().startswith("%") else x


def half_unit(text: str, sig: int | None = None) -> float:
    """Half a unit in the last digit of the first number of ``text`` (percent: of the fraction).
    ``sig``: the significant digits the value was formatted to (``.3g`` drops trailing zeros: "0.8"
    from ``.3g`` is 0.800, good to 0.0005, not 0.05)."""
    import math

    m = _NUM.search(text)
    s = m.group().replace(",", "").lower()
    mant, _, exp = s.partition("e")
    if sig is not None and float(s) != 0:
        h = 0.5 * 10.0 ** (math.floor(math.log10(abs(float(s)))) - sig + 1)
    else:
        decimals = len(mant.split(".")[1]) if "." in mant else 0
        h = 0.5 * 10.0 ** (-decimals) * 10.0 ** (int(exp) if exp else 0)
    return h / 100 if text[m.end():].lstrip().startswith("%") else h


def shown_interval(text: str, sig: int | None = None) -> tuple[float, float]:
    """The interval of true values that display as ``text`` (rounded to its digits)."""
    x, h = number(text), half_unit(text, sig)
    return x - h, x + h


def assert_shown(shown: str, fn, inputs: dict, what: str = "") -> float:
    """``shown`` (a readout) is ``fn(**inputs)`` rounded as displayed. An input is a number (exact), or
    the text a slider shows, or ``(text, significant digits of its format)``: a shown input is rounded
    itself, so ``fn`` is evaluated at every corner of the inputs' intervals and the readout must lie
    within [min, max], widened by half its last digit. Returns fn at the shown inputs."""
    names, ranges = list(inputs), []
    for v in inputs.values():
        if isinstance(v, tuple):
            ranges.append(shown_interval(*v) + (number(v[0]),))
        elif isinstance(v, str):
            ranges.append(shown_interval(v) + (number(v),))
        else:
            ranges.append((v, v, v))
    centre = fn(**{n: r[2] for n, r in zip(names, ranges)})
    vals = [fn(**dict(zip(names, corner))) for corner in product(*[(r[0], r[1]) for r in ranges])]
    lo, hi = min(vals + [centre]), max(vals + [centre])
    x, h = number(shown), half_unit(shown)
    eps = 1e-12 * max(1.0, abs(x))
    assert lo - h - eps <= x <= hi + h + eps, (
        f"{what}: page shows {shown!r}, the library gives {centre!r} (range {lo!r}..{hi!r} over the "
        f"rounding of the inputs {inputs})")
    return centre


# -- JupyterLab -------------------------------------------------------------------------------------

LAB_SETTINGS = {
    # nothing written behind the test's back, every cell in the DOM, no calls home
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"checkForUpdates": False,
                                                                      "fetchNews": "false"},
    "@jupyterlab/extensionmanager-extension/plugin.jupyterlab-settings": {"enabled": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (kernels run in their own sessions: a process-group kill misses
    them)."""
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class JupyterLab:
    """``jupyter lab`` on 127.0.0.1 (free port, a token) over ``root_dir``, with its config, runtime,
    settings and workspaces in ``work`` (autosave off), ``env`` added to its (and its kernels')
    environment. ``stop()`` shuts the kernels and the server down and kills, by pid, whatever of theirs
    is left."""

    def __init__(self, root_dir: Path, work: Path, env: dict[str, str] | None = None):
        self.root_dir, self.work = Path(root_dir), Path(work)
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()
        self.log_path = self.work / "jupyterlab.log"

    # REST
    def api(self, method: str, path: str, timeout: float = 10):
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def start(self, timeout: float = 90) -> JupyterLab:
        settings = self.work / "settings"
        for name, value in LAB_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(value))
        env = dict(os.environ)
        for k in ("config", "runtime", "workspaces", "ipython"):
            (self.work / k).mkdir(parents=True, exist_ok=True)
        env.update(JUPYTER_CONFIG_DIR=str(self.work / "config"), JUPYTER_RUNTIME_DIR=str(self.work / "runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(self.work / "workspaces"),
                   IPYTHONDIR=str(self.work / "ipython"), PYTHONUNBUFFERED="1")
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".pytest_cache" / "inductor"))
        env.update(self.extra_env)
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root_dir}", "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
               "--ServerApp.shutdown_no_activity_timeout=1800", "--MappingKernelManager.cull_idle_timeout=0"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=self.work, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self.proc.returncode}):\n{self.log()}")
            try:
                self.api("GET", "/api/status", timeout=2)
                self.ready_s = time.monotonic() - self.t0
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"jupyter lab did not answer in {timeout} s:\n{self.log()}")

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text()[-tail:]
        except OSError:
            return ""

    def lab_url(self, path: str) -> str:
        return f"{self.url}/lab/tree/{path}?reset&token={self.token}"

    def note_pids(self) -> None:
        """Remember the server's descendants now (kernels, their subprocesses) for stop()."""
        if self.proc:
            self.seen_pids |= descendants(self.proc.pid)

    def shutdown_kernels(self) -> None:
        self.note_pids()
        try:
            for k in self.api("GET", "/api/kernels"):
                self.api("DELETE", f"/api/kernels/{k['id']}", timeout=30)
        except (urllib.error.URLError, OSError):
            pass

    def stop(self) -> list[int]:
        """Stop everything; return the pids that had to be killed (should be empty)."""
        if not self.proc:
            return []
        self.shutdown_kernels()
        self.note_pids()
        try:
            self.api("POST", "/api/shutdown", timeout=10)
        except (urllib.error.URLError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        killed = []
        deadline = time.monotonic() + 5
        for pid in sorted(self.seen_pids):
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        self.proc = None
        return killed
