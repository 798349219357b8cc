"""The live-captions page (parakeet_stream/web/) served by a real `parakeet-serve` process.

The HTTP checks (content types, Content-Security-Policy, no path traversal) need nothing
else. The page checks run it in a real browser: Debian's `chromium` (apt-get install
chromium), headless, driven by Playwright's Python package (its bundled browsers are never
used or downloaded: `executable_path` is the system chromium). Chromium's fake microphone
plays an espeak-ng sentence generated into tmp_path; the page captures it with an
AudioWorklet and streams binary PCM16 frames over the native WebSocket protocol.

- `test_page_streams_captions`: the tiny fixture model; the whole start / results / stop /
  final cycle, the declared capture rate, the latency readout, and the default Origin
  policy (--allowed-origins unset) accepting the page's own origin; no demo-model notice;
  the footer at the bottom of a tall window.
- `test_page_api_key_origin_and_queue`: `?api_key=` passed on to the WebSocket, a missing
  key refused, an explicit --allowed-origins enforced (the same page opened through
  `localhost` is a different origin), and "waiting, position 1" while the only slot is busy.
- `test_live_captions_match_transcribe`: the bundled demo model (skipped while
  weights/demo/config.json is absent): the page shows exactly what `parakeet-transcribe`
  prints for the audio the page sent and for the wav itself, non-empty, finalized on stop;
  the notice that the demo model understands synthetic speech only, and how to get the real one;
  screenshot to results/web_page.png (tests never modify tracked files: the README's
  docs/web_page.png is made by `python -m scripts.readme_screenshot`).

Only a missing chromium skips the browser tests (set PARAKEET_CHROMIUM to use another path).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers import ServerProcess

from demo_model.speech import PAGE_SENTENCE as SENTENCE
from demo_model.speech import page_speech_wav as speech_wav
from parakeet_stream.server.operations.http import static_file

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "parakeet_stream" / "web"
DEMO = ROOT / "weights" / "demo"
TIMEOUT_MS = 30_000
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # the tests may run as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--use-fake-ui-for-media-stream",  # grant the microphone without a prompt
    "--use-fake-device-for-media-stream",
]


def find_chromium() -> str | None:
    for candidate in (os.environ.get("PARAKEET_CHROMIUM"), "/usr/bin/chromium", "chromium", "chromium-browser"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not found (apt-get install chromium, or set PARAKEET_CHROMIUM)"
)


# ---------------------------------------------------------------- HTTP, no browser


def http_request(port: int, target: str, host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    """A GET sent byte for byte (no client-side normalization of `..` or %-escapes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    server = ServerProcess(tiny_model_dir)
    yield server
    server.close()


def test_static_files_types_and_csp(tiny_server):
    http, ws = tiny_server.ports["http"], tiny_server.ports["ws"]
    status, headers, body = http_request(http, "/")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert body == (WEB / "index.html").read_bytes()
    csp = {d.split()[0]: d.split()[1:] for d in headers["content-security-policy"].split("; ")}
    assert csp["default-src"] == ["'self'"] and csp["script-src"] == ["'self'"] and csp["style-src"] == ["'self'"]
    assert csp["connect-src"] == ["'self'", f"ws://127.0.0.1:{ws}", f"wss://127.0.0.1:{ws}"]
    assert "unsafe-inline" not in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
    # the page's own files, with the types browsers insist on for module scripts and styles
    expected = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
    for file in sorted(WEB.iterdir()):
        status, headers, body = http_request(http, f"/{file.name}")
        assert (status, headers["content-type"], body) == (200, expected[file.suffix], file.read_bytes()), file.name
    # a Host the CSP cannot name (IPv6 literal) falls back to any host, still only that port
    _, headers, _ = http_request(http, "/", host="[::1]")
    assert f"connect-src 'self' ws://*:{ws} wss://*:{ws};" in headers["content-security-policy"]


def test_page_has_no_inline_code():
    html = (WEB / "index.html").read_text()
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.DOTALL)
    assert scripts and all(not s.strip() for s in scripts), "inline <script> content"
    assert all(re.search(r'\bsrc="[\w.-]+\.js"', tag) for tag in re.findall(r"<script\b[^>]*>", html))
    assert not re.search(r"\son\w+\s*=", html) and "style=" not in html and "<style" not in html
    assert "javascript:" not in html and "http://" not in html and "https://" not in html  # no CDN
    for module in WEB.glob("*.js"):  # every relative import resolves to a file of the folder
        for name in re.findall(r'from\s+"\./([\w.-]+)"', module.read_text()):
            assert (WEB / name).is_file(), f"{module.name} imports missing {name}"


TRAVERSALS = [
    "/../__init__.py",
    "/../server/operations/http.py",
    "/../../pyproject.toml",
    "/web/../../pyproject.toml",
    "/%2e%2e/__init__.py",
    "/%2E%2E/server/operations/http.py",
    "/.%2e/__init__.py",
    "/%2e%2e%2f__init__.py",
    "/..%2f..%2fpyproject.toml",
    "/%2e%2e%2f%2e%2e%2fpyproject.toml",
    "/%252e%252e/__init__.py",
    "/..%5c__init__.py",
    "/%2fetc%2fpasswd",
    "//etc/passwd",
    "/index.html%00.js",
    "/%ff%fe",
    "/.hidden",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_no_path_traversal(tiny_server, target):
    status, _, body = http_request(tiny_server.ports["http"], target)
    assert status == 404 and body == b'{"error":"not found"}', (target, status, body[:80])


def test_static_file_stays_in_root(tmp_path):
    root, outside = tmp_path / "web", tmp_path / "secret.txt"
    root.mkdir()
    outside.write_text("secret")
    (root / "page.html").write_text("<p>hi</p>")
    (root / "link.txt").symlink_to(outside)
    (root / "sub").mkdir()
    assert static_file("/page.html", root) == (b"<p>hi</p>", "text/html")
    assert static_file("/sub/..%2fpage.html", root) is None  # no `..` at all, even inside the root
    for path in ("/link.txt", "/../secret.txt", "/%2e%2e/secret.txt", "/sub", "/missing.js"):
        assert static_file(path, root) is None, path


# ---------------------------------------------------------------- the page in chromium


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is not installed (scripts/test.sh installs it)")
    return speech_wav(tmp_path_factory.mktemp("web_audio") / "sentence.wav")


@pytest.fixture(scope="module")
def browser(wav, tmp_path_factory):
    """Headless chromium (fresh profile) whose microphone plays `wav` once, then silence."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[test]' (never `playwright install`)")
    flags = [*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"]
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium_profile")), executable_path=CHROMIUM, headless=True, args=flags
        )
        yield context
        context.close()


class Page:
    """One tab of the captions page, recording page errors and console errors (CSP included)."""

    def __init__(self, context, url: str) -> None:
        self.page = context.new_page()
        self.problems: list[str] = []
        self.page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        self.page.on("console", self._console)
        self.page.goto(url)
        self.page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)

    def _console(self, message) -> None:
        # a refused WebSocket handshake is logged by chromium itself; everything else is a problem
        if message.type == "error" and "WebSocket connection to" not in message.text:
            self.problems.append(f"console: {message.text}")

    @property
    def state(self) -> str:
        return self.page.get_attribute("body", "data-state")

    def text(self, selector: str) -> str:
        return self.page.inner_text(selector)

    def wait_state(self, *states: str) -> str:
        selector = ", ".join(f"body[data-state={s}]" for s in states)
        self.page.wait_for_selector(selector, timeout=TIMEOUT_MS)
        return self.state

    def wait_sent(self, seconds: float) -> None:
        self.page.wait_for_function(
            f"() => Number(document.querySelector('#sent').dataset.seconds) >= {seconds}", timeout=TIMEOUT_MS
        )

    def captions(self) -> tuple[list[str], list[str]]:
        """(final caption lines, partial caption lines)."""
        return (self.page.locator(".caption.final").all_inner_texts(),
                self.page.locator(".caption.partial").all_inner_texts())

    def close(self) -> None:
        self.page.close()
        assert not self.problems, self.problems


def assert_footer_at_bottom(page: Page, height: int) -> None:
    """On a window taller than the page's content the footer sits at the window's bottom edge."""
    size = page.page.viewport_size
    page.page.set_viewport_size({"width": size["width"], "height": height})
    box = page.page.locator("footer").bounding_box()
    assert abs(box["y"] + box["height"] - height) <= 1, (box, height)
    page.page.set_viewport_size(size)


def metric_value(port: int, name: str, labels: str = "") -> float:
    _, _, body = http_request(port, "/metrics")
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", body.decode(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@needs_chromium
def test_page_streams_captions(tiny_server, browser):
    http = tiny_server.ports["http"]
    page = Page(browser, f"http://127.0.0.1:{http}/")
    assert page.text("#status") == "ready: press Start and speak" and page.page.inner_text("#toggle") == "Start"
    assert not page.page.is_visible("#demo-notice")  # not the demo model
    assert_footer_at_bottom(page, height=2400)
    # the browser enforces the CSP: injected inline code does not run, other hosts are unreachable
    page.page.evaluate("""() => {
        const s = document.createElement("script"); s.textContent = "window.injected = 1"; document.body.append(s);
        try { new WebSocket("ws://127.0.0.1:9/"); } catch (e) {} }""")
    assert page.page.evaluate("() => window.injected") is None
    assert sum("Content Security Policy" in p for p in page.problems) == 2, page.problems
    page.problems.clear()
    page.page.click("#toggle")
    page.wait_state("listening")
    page.page.wait_for_selector("#model:has-text('stream')", timeout=TIMEOUT_MS)  # hello arrived
    capture, model = re.search(r"(\d+) Hz → (\d+) Hz", page.text("#model")).groups()
    assert int(capture) in (44100, 48000) and model == "16000"  # the browser's rate, declared in `start`
    page.wait_sent(1.5)
    page.page.wait_for_selector("#latency[data-seconds]", timeout=TIMEOUT_MS)  # results came back
    latency = float(page.page.get_attribute("#latency", "data-seconds"))
    assert 0 <= latency < 10 and re.match(r"\d+ ms \(median \d+ ms\) · server \d+ ms", page.text("#latency"))
    assert page.page.inner_text("#toggle") == "Stop"
    page.page.click("#toggle")
    assert page.wait_state("done", "error") == "done", page.text("#status")
    page.page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('finished')")
    assert page.captions()[1] == []  # nothing left partial after the final result
    assert page.page.inner_text("#toggle") == "Start"
    page.close()
    assert metric_value(http, "parakeet_streams_total", '{protocol="ws"}') == 1
    assert metric_value(http, "parakeet_errors_total", '{code="forbidden_origin"}') == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_chromium
def test_page_api_key_origin_and_queue(tiny_model_dir, browser):
    http = free_port()
    server = ServerProcess(
        tiny_model_dir, "--http-port", str(http), "--api-key", "s3cret", "--max-num-streams", "1",
        "--allowed-origins", f"http://127.0.0.1:{http}",
    )
    try:
        page_url = f"http://127.0.0.1:{http}/"
        first = Page(browser, page_url + "?api_key=s3cret")
        first.page.click("#toggle")
        first.wait_state("listening")
        first.page.wait_for_selector("#model:has-text('stream')", timeout=TIMEOUT_MS)
        second = Page(browser, page_url + "?api_key=s3cret")  # the only slot is taken
        second.page.click("#toggle")
        assert second.wait_state("queued", "error") == "queued"
        assert second.text("#status").startswith("waiting, position 1")
        first.page.click("#toggle")
        assert first.wait_state("done", "error") == "done", first.text("#status")
        assert second.wait_state("listening") == "listening"  # admitted (hello) once the slot is free
        second.page.click("#toggle")
        assert second.wait_state("done", "error") == "done", second.text("#status")

        no_key = Page(browser, page_url)
        no_key.page.click("#toggle")
        assert no_key.wait_state("error", "done") == "error" and "refused" in no_key.text("#status")
        other_origin = Page(browser, f"http://localhost:{http}/?api_key=s3cret")
        other_origin.page.click("#toggle")
        assert other_origin.wait_state("error", "done") == "error" and "refused" in other_origin.text("#status")
        for page in (first, second, no_key, other_origin):
            page.close()
        assert metric_value(http, "parakeet_errors_total", '{code="unauthorized"}') == 1
        assert metric_value(http, "parakeet_errors_total", '{code="forbidden_origin"}') == 1
        assert metric_value(http, "parakeet_streams_total", '{protocol="ws"}') == 2
    finally:
        server.close()


def transcribe_cli(wavs: list[Path], capsys) -> list[str]:
    """What `parakeet-transcribe --model weights/demo WAV...` prints, run in this process."""
    from parakeet_stream.tools import transcribe

    capsys.readouterr()
    assert transcribe.main([*map(str, wavs), "--model", str(DEMO), "--device", "cpu", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return [json.loads(line)["text"] for line in lines[-len(wavs):]]


def speech_onset(pcm: np.ndarray, rate: int) -> float:
    """Seconds before the first sample above -40 dBFS."""
    return int(np.argmax(np.abs(pcm.astype(np.int32)) > 328)) / rate


@needs_chromium
@pytest.mark.skipif(not (DEMO / "config.json").is_file(),
                    reason="weights/demo/config.json is absent: the demo model is not trained/exported yet "
                           "(python -m demo_model.train)")
def test_live_captions_match_transcribe(wav, browser, capsys, tmp_path):
    duration = sf.info(wav).duration
    frames: list[str | bytes] = []  # what the page sent, as the server received it
    server = ServerProcess(DEMO)
    try:
        page = Page(browser, f"http://127.0.0.1:{server.ports['http']}/")
        notice = page.text("#demo-notice")  # shown, and saying what to do instead
        assert page.page.is_visible("#demo-notice"), "no demo-model notice"
        assert "synthetic speech" in notice and "not your voice" in notice and "bash scripts/serve.sh" in notice
        assert page.text("#status") == "ready: press Start (demo model: synthetic speech only)"
        page.page.on("websocket", lambda ws: ws.on("framesent", lambda frame: frames.append(frame)))
        page.page.click("#toggle")
        page.wait_state("listening")
        page.wait_sent(duration)  # the whole wav has been played and sent, in real time
        page.page.click("#toggle")
        assert page.wait_state("done", "error") == "done", page.text("#status")
        final, partial = page.captions()
        shown = page.page.get_attribute("#captions", "data-text")  # every delta, concatenated
        screenshot = ROOT / "results" / "web_page.png"  # the artifact, pass or fail
        screenshot.parent.mkdir(exist_ok=True)
        page.page.screenshot(path=str(screenshot))
        page.close()
    finally:
        server.close()

    # the page's protocol: a `start` declaring the capture rate, binary PCM16, a final `audio`
    start, *audio, end = frames
    assert json.loads(start) == {"type": "start", "sample_rate": json.loads(start)["sample_rate"], "encoding": "pcm16"}
    assert json.loads(end) == {"type": "audio", "data": "", "encoding": "pcm16", "final": True}
    assert audio and all(isinstance(f, bytes) for f in audio)
    rate, pcm = json.loads(start)["sample_rate"], np.frombuffer(b"".join(audio), "<i2")
    # all of the sentence was sent: it starts about where it starts in the wav (the browser
    # adds or drops a few ms of the leading silence) and nothing of it is missing
    onset, wav_onset = speech_onset(pcm, rate), speech_onset(*sf.read(wav, dtype="int16"))
    assert abs(onset - wav_onset) < 0.2 and len(pcm) / rate >= duration + onset - wav_onset - 0.05, (
        onset, wav_onset, len(pcm) / rate)
    sent = tmp_path / "sent.wav"  # the audio exactly as the page sent it, at its declared rate
    sf.write(sent, pcm, rate, subtype="PCM_16")
    expected, expected_sent = transcribe_cli([wav, sent], capsys)

    # the captions show the transcript (split into lines at utterance ends)
    assert "".join(final + partial).replace(" ", "") == shown.replace(" ", ""), (final, partial, shown)
    # the server transcribes what it received exactly as the offline CLI does (resampling, chunking, final flush)
    assert shown == expected_sent, f"page: {shown!r}\ntranscribe of the sent audio: {expected_sent!r}"
    # (not compared with the wav's own transcript: the browser adds or drops a few ms of leading
    # silence, which can move a weak model's decisions)
    assert shown.strip() and expected.strip(), f"the demo model transcribes {SENTENCE!r} as nothing"
    assert final and not partial, (final, partial)  # stop finalized the captions
