"""Loopback ports and process groups for the servers, clusters and browsers the tests start."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at the moment (the kernel's pick); also what a test uses as a closed port."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # the group exists, under another user
        return True


def kill_group(proc: subprocess.Popen, grace: float = 10) -> None:
    """Stop a process started with start_new_session=True and everything it spawned (ENVIRONMENT.md):
    SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is None or group_alive(proc.pid):
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (proc.poll() is None or group_alive(proc.pid)):
                time.sleep(0.1)  # poll() reaps the leader: a zombie would still count as a group member
            if not group_alive(proc.pid):
                break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
