"""Headless Chromium for report tests: what a 1400 px wide window shows, measured in the DOM.

The report is copied beside a probe: a script run on ``load`` that records, before anything
scrolls, the page's width against the window's, the boxes of the table's header cells, of
the row named ``name`` and of the findings. A second run takes a screenshot of the same page,
1400 px wide and tall enough for all of it, with that row scrolled into the table's box
(vertically only: the table stays at its left edge), for a human to look at and for a
pixel check.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

WIDTH, HEIGHT = 1400, 900
TALL = 3000  # the screenshot's height: the whole page, table included

PROBE = """
<script type="application/json" id="probe-want">%s</script>
<script>
window.addEventListener("load", function () {
  function box(el) {
    if (!el) return null;
    const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, text: el.textContent};
  }
  const want = JSON.parse(document.getElementById("probe-want").textContent);
  const heads = {};
  document.querySelectorAll("table.summary thead th").forEach(function (th) {
    heads[th.textContent.trim()] = box(th);
  });
  let cell = null;
  document.querySelectorAll("table.summary tbody th.name").forEach(function (th) {
    if (th.textContent === want.name) cell = th;
  });
  const wrap = document.querySelector(".table-wrap");
  const out = {
    viewport: document.documentElement.clientWidth,
    page: document.documentElement.scrollWidth,
    wrap: box(wrap),
    heads: heads,
    name: box(cell),
    row_class: cell ? cell.parentNode.className : null,
    findings: box(document.querySelector(".findings")),
    legend: Array.from(document.querySelectorAll(".legend .traces")).map(t => t.textContent),
  };
  const pre = document.createElement("pre");
  pre.id = "probe-result";
  pre.style.display = "none";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
  if (cell && want.scroll) {
    wrap.scrollTop += cell.getBoundingClientRect().top - wrap.getBoundingClientRect().top - 120;
  }
});
</script>
"""


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail(
            "Debian's chromium is needed (apt-get install chromium); the test command installs it"
        )
    return exe


def _run(
    page: Path, tmp: Path, *mode: str, height: int = HEIGHT, width: int = WIDTH
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={tmp / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            f"--window-size={width},{height}",
            "--virtual-time-budget=5000",
            *mode,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def render(html: Path, tmp: Path) -> tuple[str, str]:
    """Load a page in headless Chromium; returns the DOM after scripts ran, and the console log."""
    proc = _run(html, tmp, "--dump-dom")
    return proc.stdout, proc.stderr


def probe_page(report: Path, tmp: Path, name: str, scroll: bool = False) -> Path:
    want = json.dumps({"name": name, "scroll": scroll}).replace("</", "<\\/")
    text = report.read_text(encoding="utf-8")
    page = tmp / f"probe_{'scrolled' if scroll else 'top'}_{report.name}"
    page.write_text(text.replace("</body>", PROBE % want + "</body>", 1), encoding="utf-8")
    return page


def layout(report: Path, tmp: Path, name: str) -> tuple[dict, list[str]]:
    """What the page looks like at 1400 px (see the module doc), and the console errors."""
    proc = _run(probe_page(report, tmp, name), tmp, "--dump-dom")
    found = re.search(r'<pre id="probe-result"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    errors = [
        line
        for line in proc.stderr.splitlines()
        if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)
    ]
    return json.loads(html.unescape(found.group(1))), errors


FOLD_PROBE = """
<script>
window.addEventListener("load", function () {
  const heads = Array.from(document.querySelectorAll("h2"));
  const findings = heads.find(h => h.textContent.trim() === "Findings");
  const first = heads.find(h => h.textContent.trim() !== "Findings");
  const pre = document.createElement("pre");
  pre.id = "probe-result";
  pre.style.display = "none";
  pre.textContent = JSON.stringify({
    viewport: document.documentElement.clientWidth,
    page: document.documentElement.scrollWidth,
    findings: findings ? findings.getBoundingClientRect().top : null,
    first_other: first ? first.textContent.trim() : null,
    first_other_top: first ? first.getBoundingClientRect().top : null,
  });
  document.body.appendChild(pre);
});
</script>
"""


def fold(report: Path, tmp: Path, width: int) -> dict:
    """Where a page's Findings heading is at ``width`` px, before anything scrolls, and the
    page's width against the window's (a page wider than its window scrolls sideways)."""
    page = report.with_name(f".probe_{report.name}")  # beside it: its relative links resolve
    text = report.read_text(encoding="utf-8")
    page.write_text(text.replace("</body>", FOLD_PROBE + "</body>", 1), encoding="utf-8")
    try:
        proc = _run(page, tmp, "--dump-dom", width=width)
    finally:
        page.unlink()
    found = re.search(r'<pre id="probe-result"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def screenshot(report: Path, tmp: Path, name: str) -> Path:
    """A 1400 px wide screenshot of the whole page, the row ``name`` scrolled into the table's
    box (the box scrolls, the page does not)."""
    png = tmp / f"{report.stem}_{WIDTH}.png"
    page = probe_page(report, tmp, name, scroll=True)
    proc = _run(page, tmp, f"--screenshot={png}", height=TALL)
    assert png.is_file(), proc.stderr[-2000:]
    return png


class Cdp:
    """Headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``: JSON
    messages on fds 3 and 4, no websocket library needed), for live pages that load data
    from a local server - a single-page app keeps a stream open, which ``--virtual-time-budget``
    never sees the end of. Requests to anything but 127.0.0.1 go to a dead proxy: the page
    runs offline, and ``requests`` records every URL it asked for.
    """

    def __init__(self, tmp: Path, width: int = WIDTH, height: int = HEIGHT):
        import os

        ours_r, chrome_w = os.pipe()  # chromium writes (fd 4), we read
        chrome_r, ours_w = os.pipe()  # we write, chromium reads (fd 3)

        def fds() -> None:
            os.dup2(chrome_r, 3)
            os.dup2(chrome_w, 4)

        self.proc = subprocess.Popen(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--proxy-server=http://127.0.0.1:9",  # nothing listens there: offline
                "--proxy-bypass-list=<-loopback>;127.0.0.1",
                f"--user-data-dir={tmp / 'cdp-profile'}",
                f"--window-size={width},{height}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            pass_fds=(3, 4),  # dup2-ed there before the other descriptors are closed
            preexec_fn=fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(chrome_r)
        os.close(chrome_w)
        self._w = os.fdopen(ours_w, "wb", buffering=0)
        self._r = os.fdopen(ours_r, "rb", buffering=0)
        self._buf = b""
        self._id = 0
        self.session: str | None = None
        self.requests: list[str] = []
        self.console: list[str] = []
        pages = [t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        self.session = self.call(
            "Target.attachToTarget", targetId=pages[0]["targetId"], flatten=True
        )["sessionId"]
        self.call("Network.enable")
        self.call("Runtime.enable")

    def _event(self, msg: dict) -> None:
        if msg.get("method") == "Network.requestWillBeSent":
            self.requests.append(msg["params"]["request"]["url"])
        elif msg.get("method") == "Runtime.consoleAPICalled":
            args = msg["params"].get("args", [])
            self.console.append(
                f"{msg['params'].get('type')}: "
                + " ".join(str(a.get("value", a.get("description", ""))) for a in args)
            )

    def call(self, method: str, **params) -> dict:
        self._id += 1
        msg: dict = {"id": self._id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        self._w.write(json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = self._r.read(1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") != self._id:
                self._event(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]

    def eval(self, expression: str):
        """The value of a JavaScript expression in the page (JSON-able)."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0):
        """Poll ``expression`` until it is truthy; its value, or None at the timeout."""
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.5)
        return None

    def screenshot(self, png: Path) -> Path:
        import base64

        png.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return png

    def close(self) -> None:
        # closed through the protocol, chromium removes its /tmp/org.chromium.Chromium.* folder;
        # killed, it leaves it
        try:  # a browser-level command: no session
            self._w.write(
                json.dumps({"id": self._id + 1, "method": "Browser.close"}).encode() + b"\0"
            )
        except OSError:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
