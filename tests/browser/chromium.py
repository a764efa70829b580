"""Pages opened in a real headless Chromium: its DOM after scripts ran, a screenshot, and
every request the page made (Chromium's own network log).

Without a ``chromium`` on the PATH the tests that need one are skipped, saying so;
CI is to install Debian's ``chromium``.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on the PATH: these tests open the pages in it "
    "(apt-get install chromium)")

OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9")
"""Flags under which no name resolves and every connection goes to a closed port."""


def run_chromium(page: Path, profile: Path, *flags: str) -> str:
    """Chromium's output for ``page`` under ``flags`` (headless, a profile of its own)."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--hide-scrollbars", f"--user-data-dir={profile}", *flags, page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dump_dom(page: Path, profile: Path, *flags: str) -> str:
    """The page's DOM once loaded and its scripts ran."""
    return run_chromium(page, profile, "--dump-dom", *flags)


def page_requests(page: Path, profile: Path) -> set[str]:
    """The URLs the page itself asked for (Chromium's own requests left out), offline."""
    log = profile.parent / f"{profile.name}-net.json"
    run_chromium(page, profile, "--dump-dom", f"--log-net-log={log}", *OFFLINE)
    events = json.loads(log.read_text())["events"]
    return {e["params"]["url"] for e in events
            if "url" in e.get("params", {})
            and "file://" in e["params"].get("network_isolation_key", "")}


def screenshot_pixels(page: Path, profile: Path, size: str = "1400,1000") -> list[bytes]:
    """The rows of a screenshot of ``page``, as RGB(A) bytes."""
    shot = profile.parent / f"{profile.name}.png"
    run_chromium(page, profile, f"--screenshot={shot}", f"--window-size={size}")
    return png_rows(shot.read_bytes())


def png_rows(data: bytes) -> list[bytes]:
    """The unfiltered rows of an 8-bit RGB or RGBA PNG without interlacing."""
    chunks, at = {}, 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunks.setdefault(kind, []).append(data[at + 8:at + 8 + length])
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    rows, previous, stride = [], bytearray(width * step), width * step
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (
            stride + 1)])
        for x in range(stride):
            left = line[x - step] if x >= step else 0
            up, corner = previous[x], previous[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                near = min((abs(p - left), 0, left), (abs(p - up), 1, up),
                           (abs(p - corner), 2, corner))[2]
                line[x] = (line[x] + near) & 255
        rows.append(bytes(line))
        previous = line
    return rows


class DomText(HTMLParser):
    """A dumped DOM's text, and each table row's cells by the row's id."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self._cell: list[str] | None = None
        self.feed(dom)
        self.text = " ".join(" ".join(self.parts).split())

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._row = dict(attrs).get("id")
            if self._row:
                self.rows[self._row] = []
        elif tag in ("td", "th") and self._row:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row and self._cell is not None:
            self.rows[self._row].append(" ".join(" ".join(self._cell).split()))
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        self.parts.append(data)
        if self._cell is not None:
            self._cell.append(data)
