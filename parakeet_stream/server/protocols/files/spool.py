"""Where an upload's audio waits: in memory up to MEMORY_BYTES, then in a temporary file
(deleted when closed), with its size and SHA-256 counted as it is written."""
from __future__ import annotations

import hashlib
import tempfile

MEMORY_BYTES = 1 << 20


class Spool:
    def __init__(self) -> None:
        self.file = tempfile.SpooledTemporaryFile(max_size=MEMORY_BYTES)
        self.size = 0
        self._sha256 = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.size += len(data)
        self._sha256.update(data)

    def rewind(self) -> None:
        self.file.seek(0)

    @property
    def sha256(self) -> str:
        return self._sha256.hexdigest()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
