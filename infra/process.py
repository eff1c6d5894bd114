"""Child server processes that die with us, and the start/stop/restart lifecycle shared by the embedded
servers (Kafka, tansu, Postgres)."""

from __future__ import annotations

import abc
import atexit
import contextlib
import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from infra.paths import free_port

_PR_SET_PDEATHSIG = 1
# Loaded in the parent: the forked child must not do anything as involved as dlopen before exec.
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class InfraError(RuntimeError):
    """A server could not be fetched, started or reached."""


def wait_until_answers(
    check: Callable[[], object], errors: tuple[type[BaseException], ...], timeout_s: float, what: str
) -> float:
    """Call `check` until it does not raise one of `errors`; the seconds it took. Past `timeout_s` an
    `InfraError` says `what` is not reachable, with the last error (which must not carry a secret)."""
    began = time.monotonic()
    while True:
        try:
            check()
            return time.monotonic() - began
        except errors as exc:
            if time.monotonic() - began > timeout_s:
                raise InfraError(f"{what} not reachable: {exc}") from None
            time.sleep(0.2)


def _die_with_parent(death_signal: int, parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        # The parent may have died between fork and prctl; then no signal would ever come.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), death_signal)

    return preexec


class _Spawner:
    """Forks every child from one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process. Callers reach us
    from asyncio.to_thread workers and pytest threads that come and go, so forking there would signal the
    server as soon as that thread retired. A daemon thread ends only with the process.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._owner_pid = -1

    def spawn(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """Runs `start` (which calls Popen) on the spawner thread and returns its result."""
        with self._lock:
            # After os.fork() the thread is gone in the child process; start a new one there.
            if self._owner_pid != os.getpid():
                self._requests = queue.SimpleQueue()
                threading.Thread(target=self._serve, name="cachemesh-spawner", daemon=True).start()
                self._owner_pid = os.getpid()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((start, done))
        return done.result()

    def _serve(self) -> None:
        requests = self._requests
        while True:
            start, done = requests.get()
            try:
                done.set_result(start())
            except BaseException as exc:
                done.set_exception(exc)


_spawner = _Spawner()


_OWNER_FILE = ".cachemesh-owner-pid"


def make_temp_dir(prefix: str, *, keep: bool = False) -> Path:
    """A fresh folder under the system temp dir for a server's data.

    Unless `keep`, it is marked with our pid, and folders with the same prefix whose marked owner is
    gone are deleted first: a process killed with SIGKILL never runs its atexit cleanup.
    """
    for stale in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owner = int((stale / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # unmarked (kept on purpose, or not ours) or being created right now
        if not _pid_alive(owner):
            shutil.rmtree(stale, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if not keep:
        (path / _OWNER_FILE).write_text(str(os.getpid()))
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


class ServerProcess:
    """One running server: in its own session, tied to our life by PR_SET_PDEATHSIG, its output in a log.

    With a `line_filter` the output goes through a pipe instead, and a thread writes each line as the
    filter returns it (services: JSON lines whatever they print, see infra/service_log.py).
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
        stop_signal: int = signal.SIGTERM,
        line_filter: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self.log_path = log_path
        self._stop_signal = stop_signal
        self._reaped = False
        self._pump: threading.Thread | None = None
        kwargs: dict[str, Any] = {}
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            # Without group/extra_groups the child keeps root's groups.
            kwargs.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
        with open(log_path, "ab") as log:
            self._popen = _spawner.spawn(
                lambda: subprocess.Popen(
                    list(args),
                    stdin=subprocess.DEVNULL,
                    stdout=log if line_filter is None else subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=dict(env) if env is not None else None,
                    cwd=cwd,
                    start_new_session=True,  # our terminal's Ctrl-C goes to us; we stop the server in order
                    preexec_fn=_die_with_parent(stop_signal, os.getpid()),
                    **kwargs,
                )
            )
        if line_filter is not None:
            assert self._popen.stdout is not None
            self._pump = threading.Thread(
                target=_pump_lines,
                args=(self._popen.stdout, log_path, line_filter),
                name=f"log {log_path.name}",
                daemon=True,
            )
            self._pump.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def reaped(self) -> bool:
        return self._reaped

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def stop(self, timeout_s: float) -> None:
        """Ask politely (the stop signal), wait up to `timeout_s`, then SIGKILL the whole process group."""
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, self._stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout_s)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the server and everything it started (a crash, for tests); reaps the leader."""
        if self._reaped:
            return  # once reaped, the group id may belong to someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._popen.wait()
        self._reaped = True
        if self._pump is not None:
            # The group is gone, so the pipe is at its end: what was written last (at exit) lands.
            self._pump.join(timeout=5.0)

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 64 * 1024))
                text = log.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return f"(no log at {self.log_path}: {exc})"
        return "\n".join(text.splitlines()[-lines:])


def _pump_lines(pipe: IO[bytes], log_path: Path, line_filter: Callable[[bytes], bytes]) -> None:
    """Copies the child's output into its log a line at a time, through `line_filter`, until the pipe
    closes (the child and everything that inherited its output have exited)."""
    with pipe, open(log_path, "ab") as log:
        for raw in iter(lambda: pipe.readline(_MAX_LINE_BYTES), b""):
            out = line_filter(raw)
            if out:
                log.write(out)
                log.flush()  # `tail -f` and a crash report see it at once


# A longer line (a runaway print) is cut into records of this size rather than held in memory.
_MAX_LINE_BYTES = 1 << 20


class ManagedServer(abc.ABC):
    """Idempotent start/stop, restart on the same port and data, stop at interpreter exit, context manager.

    A server listens on `port` (a free one, picked once, unless given) and keeps its files in `data_dir`
    (a temp dir named after `temp_prefix`, removed by `stop()` unless `keep_data`; a folder you pass is
    never removed). Subclasses say how to prepare (untimed: downloads), launch and probe readiness.
    """

    name: str
    temp_prefix: str = "cachemesh-"
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0

    def __init__(
        self, port: int | None = None, data_dir: Path | str | None = None, *, keep_data: bool = False
    ) -> None:
        self._proc: ServerProcess | None = None
        self._start_seconds = 0.0
        self._lock = threading.RLock()
        self._port = port
        self._given_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._temp_dir: Path | None = None
        self._keep_data = keep_data

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = free_port()
        return self._port

    @property
    def data_dir(self) -> Path:
        if self._given_dir is not None:
            return self._given_dir
        if self._temp_dir is None:
            self._temp_dir = make_temp_dir(self.temp_prefix, keep=self._keep_data)
        return self._temp_dir

    def _remove_own_data(self) -> None:
        if self._temp_dir is not None and not self._keep_data:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    @property
    def start_seconds(self) -> float:
        """Seconds the last start took, from launch to ready (downloads excluded); 0.0 before the first."""
        return self._start_seconds

    @property
    def pid(self) -> int | None:
        """The server's process id while one was started (for crash tests); None before."""
        return self._proc.pid if self._proc is not None else None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def start(self) -> None:
        """Start the server and block until it answers a real request; does nothing if it is running."""
        with self._lock:
            if self.is_alive():
                return
            self._prepare()
            began = time.monotonic()
            deadline = began + self.start_timeout_s
            atexit.register(self.stop)
            self._proc = self._launch(deadline)
            try:
                self._wait_ready(self._proc, deadline)
            except BaseException:
                self._proc.stop(timeout_s=5.0)
                raise
            self._start_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop the server (stop signal, wait, SIGKILL) and remove data it created itself; idempotent."""
        with self._lock:
            self._stop_process()
            self._remove_own_data()
            atexit.unregister(self.stop)

    def halt(self) -> None:
        """Stop the server, keeping its data: `start()` brings it back on the same port (an outage as
        long as the caller wants)."""
        with self._lock:
            self._stop_process()

    def restart(self) -> None:
        """Stop and start again on the same port with the same data (what a service sees as an outage)."""
        with self._lock:
            self._stop_process()
            self.start()

    def kill(self) -> None:
        """SIGKILL the server's process group, keeping its data; `restart()` or `start()` brings it back."""
        with self._lock:
            if self._proc is not None:
                self._proc.kill()

    def log_tail(self, lines: int = 40) -> str:
        return self._proc.log_tail(lines) if self._proc is not None else "(not started)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _stop_process(self) -> None:
        if self._proc is not None and not self._proc.reaped:
            self._proc.stop(self.stop_timeout_s)
            self._after_stop(self._proc)

    def _after_stop(self, proc: ServerProcess) -> None:  # noqa: B027 - optional hook
        """Runs once after an orderly stop (not after `kill()`)."""

    def _prepare(self) -> None:  # noqa: B027 - optional hook
        """Untimed work before launch (downloads, users, directories)."""

    @abc.abstractmethod
    def _launch(self, deadline: float) -> ServerProcess: ...

    @abc.abstractmethod
    def _probe(self) -> bool:
        """One readiness check: True when a real request succeeded; False or an OSError when not yet."""

    def _wait_ready(self, proc: ServerProcess, deadline: float) -> None:
        last_error: BaseException | None = None
        while True:
            if not proc.is_alive():
                raise InfraError(
                    f"{self.name} exited during start (code {proc.returncode}); "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )
            try:
                if self._probe():
                    return
            except (OSError, InfraError) as exc:
                last_error = exc
            if time.monotonic() > deadline:
                raise InfraError(
                    f"{self.name} not ready after {self.start_timeout_s:.0f} s (last error: {last_error}); "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )
            time.sleep(0.05)
