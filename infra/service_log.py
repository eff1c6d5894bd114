"""Keeps a service's log JSON lines whatever reaches its stdout and stderr: a line that is not a JSON object
(a library's print, a traceback before logging is up, the "nanobind: leaked ..." report native extensions
write after the interpreter shut logging down) becomes a record of its own, and terminal escapes go."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

# CSI (colours, cursor moves), OSC (titles, links; ended by BEL or ST), then the rest (ESC 7, ESC ( B).
_ESCAPE = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?")
# C0 controls but tab: what a spinner or a stray byte would leave after the escapes are gone.
_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")


def clean(raw: bytes) -> bytes:
    """The line as a terminal would leave it: escapes removed, only what follows the last carriage return
    (a progress bar redraws itself with one), no other control bytes, no line end."""
    line = _ESCAPE.sub(b"", raw.rstrip(b"\r\n"))
    line = line.rsplit(b"\r", 1)[-1]
    return _CONTROL.sub(b"", line)


def as_json_line(raw: bytes, service: str, now: float) -> bytes:
    """One line of output as one JSON-lines record (ending in a newline), or b"" for a blank line. A JSON
    object passes through as it was written; anything else is wrapped in the services' own shape
    (services/runtime/logs.py) under the logger `stderr`, at warning level: nobody meant to log it."""
    line = clean(raw)
    if not line.strip():
        return b""
    if line.lstrip().startswith(b"{"):
        try:
            if isinstance(json.loads(line), dict):
                return line.strip() + b"\n"
        except ValueError:
            pass
    doc = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
        "level": "warning",
        "service": service,
        "logger": "stderr",
        "msg": line.decode("utf-8", errors="replace"),
    }
    return json.dumps(doc).encode() + b"\n"


def json_lines_for(service: str, clock: Callable[[], float] = time.time) -> Callable[[bytes], bytes]:
    """The line filter a `ServerProcess` runs a service's output through."""
    return lambda raw: as_json_line(raw, service, clock())
