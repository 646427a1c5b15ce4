"""Headless Chromium for the end-to-end tests, driven over the Chrome DevTools protocol.

Debian's `chromium` (installed by .ci/sysdeps.sh) with a small DevTools client on `websockets` (pinned in
requirements.txt, Airflow's uvicorn needs it): Selenium would add chromedriver and Playwright its own
browser build, for the handful of calls these tests make (navigate, evaluate, set a cookie, screenshot,
read the events the page produced)."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

import pytest
from websockets.sync.client import connect

from tests.support.processes import kill_group

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The Chromium binary; installed with apt-get when missing (skip only if apt cannot install it)."""
    found = next((shutil.which(n) for n in CHROMIUM_NAMES if shutil.which(n)), None)
    if found:
        return found
    apt = shutil.which("apt-get")
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if apt and sudo is not None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in ([*sudo, apt, "update", "-qq"], [*sudo, apt, "install", "-y", "-qq", "chromium"]):
            if subprocess.run(cmd, env=env, capture_output=True, timeout=900).returncode != 0:
                break
    found = next((shutil.which(n) for n in CHROMIUM_NAMES if shutil.which(n)), None)
    if not found:
        pytest.skip("Chromium is not installed and apt-get could not install it (Debian package `chromium`)")
    return found


class CDP:
    """A minimal Chrome DevTools protocol client over one page's websocket. Every event the page sends
    while a call waits for its answer is kept in `events`, in order."""

    def __init__(self, ws):  # an open websockets.sync connection to the page
        self.ws = ws
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, poll: float = 0.2):
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:  # e.g. evaluated while a navigation swaps the document
                value, last_error = None, exc
            if value:
                return value
            time.sleep(poll)
        raise AssertionError(f"timed out waiting for {expression!r} (last error: {last_error})")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def screenshot(self, path: Path, width: int = 1280) -> None:
        height = int(self.call("Page.getLayoutMetrics")["cssContentSize"]["height"])
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=max(height, 600), deviceScaleFactor=1,
                  mobile=False)
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": max(height, 600), "scale": 1})
        self.call("Emulation.clearDeviceMetricsOverride")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.contextmanager
def headless_chromium(scratch: Path) -> Iterator[CDP]:
    """Headless Chromium with a fresh profile under `scratch` and a DevTools endpoint; a CDP client on its
    first page with the Page, Runtime, Log and Network events on. Stopped with its process group."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=scratch))
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
            "--remote-debugging-port=0", "--window-size=1280,900", "about:blank"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, "Chromium exited at start"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as res:
            pages = [t for t in json.loads(res.read()) if t["type"] == "page"]
        with connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            cdp = CDP(ws)
            for domain in ("Page", "Runtime", "Log", "Network"):
                cdp.call(f"{domain}.enable")
            yield cdp
    finally:
        kill_group(proc, grace=5)


def svg(dom: str, cls: str) -> ET.Element:
    """The page's `<svg class=cls>`, parsed, with plain tag names."""
    match = re.search(rf'<svg[^>]*class="{cls}".*?</svg>', dom, re.S)
    assert match, f"no <svg class={cls!r}> in the page"
    root = ET.fromstring(match.group(0))
    for node in root.iter():  # plain tag names whether or not the serializer wrote the SVG namespace
        node.tag = node.tag.rsplit("}", 1)[-1]
    return root
