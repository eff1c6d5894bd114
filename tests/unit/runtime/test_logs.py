import logging

import pytest

from services.runtime.logs import configure_logging


@pytest.fixture
def restore_logging():  # type: ignore[no-untyped-def]
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {n: logging.getLogger(n).level for n in ("aiokafka", "httpx", "httpcore")}
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_client_libraries_log_warnings_only_while_ours_log_info(restore_logging) -> None:  # type: ignore[no-untyped-def]
    configure_logging("t", "INFO")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)  # no line per HTTP request
    assert not logging.getLogger("aiokafka").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    assert logging.getLogger("services.gateway").isEnabledFor(logging.INFO)
    configure_logging("t", "DEBUG")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
