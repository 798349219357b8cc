"""Regenerates docs/web_page.png, the README's picture of the live-captions page.

Starts `parakeet-serve` on the bundled demo model, opens the page in headless chromium (Debian's
`chromium`, driven by Playwright's Python package; PARAKEET_CHROMIUM names another binary) whose
fake microphone plays an espeak-ng sentence, lets it caption the sentence, stops, and saves the
screenshot. Needs `apt-get install chromium espeak-ng` and `pip install -e '.[test]'`.

    .venv/bin/python -m scripts.readme_screenshot [OUT.png]
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import soundfile as sf

from demo_model.speech import page_speech_wav  # the page tests' own espeak-ng sentence

ROOT = Path(__file__).resolve().parent.parent

TIMEOUT_MS = 60_000


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "web_page.png"
    chromium = shutil.which(os.environ.get("PARAKEET_CHROMIUM", "chromium"))
    if chromium is None or shutil.which("espeak-ng") is None:
        print("readme_screenshot: needs chromium and espeak-ng (apt-get install chromium espeak-ng)", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="parakeet-screenshot-") as tmp:
        wav = Path(tmp) / "speech.wav"
        seconds = sf.info(str(page_speech_wav(wav))).duration
        server = subprocess.Popen(
            [sys.executable, "-m", "parakeet_stream.server.cli", "--model", "demo", "--port", "0", "--ws-port", "0",
             "--http-port", "0", "--grpc-port", "0", "--log-level", "warning"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            ready = next(line for line in server.stdout if line.startswith("parakeet-serve ready:"))
            http = re.search(r"http://127\.0\.0\.1:(\d+)", ready)[1]
            flags = ["--no-sandbox", "--disable-gpu", "--use-fake-ui-for-media-stream",
                     "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}%noloop"]
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, headless=True, args=flags)
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{http}/")
                page.wait_for_selector("body[data-state=idle]", timeout=TIMEOUT_MS)
                page.click("#toggle")
                page.wait_for_function(
                    f"() => Number(document.querySelector('#sent').dataset.seconds) >= {seconds}", timeout=TIMEOUT_MS)
                page.click("#toggle")
                page.wait_for_selector("body[data-state=done]", timeout=TIMEOUT_MS)
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
