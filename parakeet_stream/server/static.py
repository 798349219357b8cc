"""Static files under parakeet_stream/web/ (the browser page lives there)."""
from __future__ import annotations

import mimetypes
from pathlib import Path
from urllib.parse import unquote

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"

# Fixed types for what the page uses: module scripts need a JavaScript type whatever the
# system's mime.types says (browsers refuse `import` of text/plain), stylesheets need text/css.
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain",
}


def static_file(path: str, root: Path = WEB_ROOT) -> tuple[bytes, str] | None:
    """The file a GET of `path` names (`/` -> index.html), or None; never leaves `root`.

    `path` is the URL path, still percent-encoded: it is decoded once here, and any `..`,
    `.`-file, backslash or NUL segment is refused before the file system is asked.
    """
    try:
        segments = [s for s in unquote(path, errors="strict").split("/") if s]
    except UnicodeDecodeError:
        return None
    if any(s.startswith(".") or "\\" in s or "\0" in s for s in segments):
        return None
    root = root.resolve()
    candidate = root.joinpath(*segments) if segments else root / "index.html"
    try:
        candidate = candidate.resolve()
        if not candidate.is_relative_to(root) or not candidate.is_file():
            return None
        body = candidate.read_bytes()
    except (OSError, ValueError):
        return None
    suffix = candidate.suffix.lower()
    content_type = CONTENT_TYPES.get(suffix) or mimetypes.guess_type(candidate.name)[0] or "application/octet-stream"
    return body, content_type
