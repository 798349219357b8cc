"""Static files under parakeet_stream/web/ (the browser page lives there)."""
from __future__ import annotations

import mimetypes
from pathlib import Path

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"


def static_file(path: str, root: Path = WEB_ROOT) -> tuple[bytes, str] | None:
    """The file a GET of `path` names (`/` -> index.html), or None; never leaves `root`."""
    relative = path.lstrip("/") or "index.html"
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    content_type = mimetypes.guess_type(candidate.name)[0] or "application/octet-stream"
    return candidate.read_bytes(), content_type
