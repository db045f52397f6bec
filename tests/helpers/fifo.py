"""Calls that must not block on a FIFO planted where a file was expected (docs/security.md)."""
from __future__ import annotations

import os
import threading

import pytest


def no_block(fn, fifo, timeout: float = 10.0):
    """fn() in a thread: fails the test (after unblocking it) if it is still waiting on `fifo` after
    `timeout` seconds; re-raises what fn raised."""
    result = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised in the test's thread)
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        try:  # a writer that closes at once: the blocked reader sees end of file
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        t.join(5)
        pytest.fail(f"blocked on the FIFO {fifo}")
    if "error" in result:
        raise result["error"]
    return result.get("value")
