"""multipart/form-data bodies (OpenAI's upload form), parsed as they arrive by python-multipart's
streaming parser: the file part goes to the spool, the other fields (small) are kept as text.
`write` and `close` run in a worker thread."""
from __future__ import annotations

import logging

from python_multipart.exceptions import FormParserError, MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from .exchange import UploadError
from .spool import Spool

MAX_FIELD_BYTES = 64 * 1024  # every field but the file, together

# python-multipart logs each malformed body as a warning: a client's mistake, answered with a 400
logging.getLogger("python_multipart").setLevel(logging.ERROR)


class FormSink:
    def __init__(self, content_type: str, spool: Spool, file_field: str = "file") -> None:
        kind, options = parse_options_header(content_type)
        if kind != b"multipart/form-data":
            raise UploadError(400, "invalid_request", "the body must be multipart/form-data with the audio in 'file'")
        if not options.get(b"boundary"):
            raise UploadError(400, "invalid_multipart", "the multipart/form-data Content-Type has no boundary")
        self.fields: dict[str, list[str]] = {}
        self.has_file = False
        self._spool = spool
        self._file_field = file_field
        self._field_bytes = 0
        self._headers: dict[bytes, bytes] = {}
        self._header = [b"", b""]
        self._name = ""
        self._value: bytearray | None = None  # the field being read (None: the file)
        self._ended = False
        callbacks = {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._add_header(0, data[start:end]),
            "on_header_value": lambda data, start, end: self._add_header(1, data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }
        try:
            self._parser = MultipartParser(options[b"boundary"], callbacks)
        except FormParserError as exc:
            raise UploadError(400, "invalid_multipart", str(exc)) from None

    def write(self, data: bytes) -> None:
        try:
            self._parser.write(data)
        except MultipartParseError:
            raise UploadError(
                400, "invalid_multipart", "the multipart body is malformed (does its boundary match the Content-Type's?)"
            ) from None

    def close(self) -> None:
        """At the end of the body: it must have closed its last part, and carried the file."""
        self._parser.finalize()
        if not self._ended:
            raise UploadError(400, "invalid_multipart", "the multipart body ended before its closing boundary")
        if not self.has_file:
            raise UploadError(400, "missing_required_parameter", f"the '{self._file_field}' field is required",
                              self._file_field)

    def _part_begin(self) -> None:
        self._headers = {}

    def _add_header(self, index: int, data: bytes) -> None:
        self._header[index] += data

    def _header_end(self) -> None:
        self._headers[self._header[0].strip().lower()] = self._header[1].strip()
        self._header = [b"", b""]

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b"").decode("latin-1"))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name != self._file_field:
            self._value = bytearray()
        elif self.has_file:
            raise UploadError(400, "invalid_request", f"more than one '{self._file_field}' field", self._file_field)
        else:
            self.has_file = True
            self._value = None

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._value is None:
            self._spool.write(data[start:end])
            return
        self._field_bytes += end - start
        if self._field_bytes > MAX_FIELD_BYTES:
            raise UploadError(400, "invalid_request", f"the form's fields take more than {MAX_FIELD_BYTES} bytes")
        self._value += data[start:end]

    def _part_end(self) -> None:
        if self._value is not None:
            value = self._value.decode("utf-8", "replace")
            self.fields.setdefault(self._name, []).append(value)

    def _end(self) -> None:
        self._ended = True
