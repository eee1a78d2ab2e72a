"""A page opened in a real headless Chromium, driven over its DevTools protocol through a pipe
(`--remote-debugging-pipe`: NUL-separated JSON on fds 3 and 4), with the standard library only.

`open_page(path)` loads a file, waits for its load event and returns what a reader would meet: the
title, each image's natural size, and every console error, uncaught exception and failed load."""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field


def chromium() -> str | None:
    """The Chromium on PATH (Debian's `chromium`, or the names other systems give it)."""
    return next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)


@dataclass
class Page:
    title: str
    headings: list[str]
    images: list[dict]  # {"alt", "naturalWidth", "naturalHeight", "complete"}
    errors: list[str] = field(default_factory=list)


#: What the page shows once loaded, read in the page itself.
_READ_PAGE = """JSON.stringify({
  title: document.title,
  headings: [...document.querySelectorAll('h1, h2')].map(h => h.textContent),
  images: [...document.images].map(i => ({alt: i.alt, naturalWidth: i.naturalWidth,
                                          naturalHeight: i.naturalHeight, complete: i.complete})),
})"""


_TRAMPOLINE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
               "os.close(int(sys.argv[1])); os.close(int(sys.argv[2])); os.execvp(sys.argv[3], sys.argv[3:])")


class _DevTools:
    def __init__(self, browser: str, profile: str) -> None:
        self._log = tempfile.TemporaryFile()  # Chromium's own stderr, read only if it dies
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()
        # Chromium reads fd 3 and writes fd 4: a Python trampoline puts the pipes there (moved above 9
        # first, so that neither is overwritten by the other) and becomes Chromium.
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)]
        os.close(to_browser)
        os.close(from_browser)
        self.process = subprocess.Popen(
            [sys.executable, "-c", _TRAMPOLINE, *map(str, ends),
             browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log, pass_fds=ends)
        for fd in ends:
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        reply = self.wait(lambda m: m.get("id") == self._next_id, timeout)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait(self, matches, timeout: float) -> dict:
        """The next message that `matches`; events met on the way are kept in `events`."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if matches(message):
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"no answer from Chromium in {timeout:.0f} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                self._log.seek(0)
                raise RuntimeError("Chromium closed its DevTools pipe: "
                                   + self._log.read().decode(errors="replace")[-2000:])
            self._buffer += chunk

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._log.close()


def _error_of(event: dict) -> str | None:
    """A console error, an uncaught exception or a failed load, as one line; None for anything else."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        return "console." + params["type"] + ": " + " ".join(
            str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        return "exception: " + details.get("exception", {}).get("description", details.get("text", ""))
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip()
    return None


def open_page(path: str, browser: str, timeout: float = 60) -> Page:
    """Load `path` in a fresh headless Chromium and read it once its load event fired."""
    with tempfile.TemporaryDirectory(prefix="autofit-chromium-") as profile:
        tools = _DevTools(browser, profile)
        try:
            target = tools.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = tools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                tools.call(f"{domain}.enable", session=session)
            tools.call("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=session)
            tools.wait(lambda m: m.get("method") == "Page.loadEventFired" and m.get("sessionId") == session, timeout)
            result = tools.call("Runtime.evaluate", {"expression": _READ_PAGE, "returnByValue": True},
                                session=session)
            read = json.loads(result["result"]["value"])
            errors = [line for event in tools.events if event.get("sessionId") == session
                      if (line := _error_of(event)) is not None]
            return Page(read["title"], read["headings"], read["images"], errors)
        finally:
            tools.close()
