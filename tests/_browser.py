"""A headless chromium driven over the DevTools protocol (the `websocket-client`
package): load a page, collect its console errors and failed requests, evaluate
JavaScript in it and take a screenshot. Tests that need it skip when no chromium is
installed (`.ci/run` installs Debian's)."""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser",
                                                  "google-chrome") if shutil.which(name)), None)


def need_browser():
    """Skip the calling test when no chromium is installed (CI installs it)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium (.ci/run installs it)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    pytest.importorskip("websocket")


class Browser:
    """One headless chromium with one page; `open(url)` returns what went wrong."""

    def __init__(self, width: int = 900, height: int = 1100):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="jaxattn-chromium-")
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.time() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        import urllib.request

        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json").read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def _wait_event(self, method: str, timeout: float = 30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.ws.settimeout(max(0.05, deadline - time.time()))
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def open(self, url: str) -> list[str]:
        """Load `url` and wait for it; return its console errors, uncaught
        exceptions and failed requests, one line each."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired")
        self.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")
        return self.errors()

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description') or d['text']}")
            elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                  for a in p["args"]))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
            elif method == "Network.loadingFailed" and not p.get("canceled"):
                out.append(f"request failed: {p.get('errorText')} ({p.get('type')})")
        return out

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"].get("exception", {})
                               .get("description", result["exceptionDetails"]["text"]))
        return result["result"].get("value")

    def screenshot(self, path, full: bool = False) -> Path:
        """A PNG of the viewport, or of the whole page (`full`)."""
        params = {"format": "png"}
        if full:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": size["width"],
                                "height": min(size["height"], 12000), "scale": 1}}
        data = self.call("Page.captureScreenshot", **params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self):
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
