"""OTLP/HTTP for ``bxctl audit export`` (docs/operations.md): one request body POSTed to
``URL/v1/logs`` or ``URL/v1/traces`` with httpx, and the receiver's answer read as the
OTLP specification's "OTLP/HTTP Response" says (docs/decisions.md, "Export to
OpenTelemetry"):

- 2xx: taken, with the ``partial_success`` the receiver may report (what it rejected
  is not sent again: the specification forbids it);
- 429, 502, 503, 504, no answer, a broken connection: try again later, after the
  ``Retry-After`` the receiver asked for if it gave one;
- any other status (400 bad data, 401, 404, 413…): refused; sending the same again
  cannot help.

Headers, TLS and compression come from the standard OpenTelemetry variables
(``OTEL_EXPORTER_OTLP_HEADERS``, ``_CERTIFICATE``, ``_CLIENT_CERTIFICATE``,
``_CLIENT_KEY``, ``_COMPRESSION``, and their ``_LOGS_`` / ``_TRACES_`` forms, which win).
"""

from __future__ import annotations

import email.utils
import gzip
import ssl
import time
import urllib.parse
import zlib
from collections.abc import Mapping
from typing import Final, Literal

import attrs
import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from boxmaker import __version__
from boxmaker.formats.printable import printable

__all__ = [
    "RETRYABLE",
    "Refused",
    "Retry",
    "SettingProblem",
    "Signal",
    "SignalClient",
    "Taken",
    "settings_of",
]

Signal = Literal["logs", "traces"]
RETRYABLE: Final = frozenset({429, 502, 503, 504})
"""The statuses the OTLP specification says to retry; every other 4xx and 5xx not."""
RETRY_AFTER_MOST: Final = 600.0
"""Seconds a ``Retry-After`` is honoured up to: a longer one is waited this long."""
WORDS_MOST: Final = 300
"""Characters of a receiver's error text quoted in a message."""
PROTOBUF: Final = "application/x-protobuf"
COMPRESSIONS: Final = ("gzip", "deflate", "none")


class SettingProblem(Exception):
    """An ``OTEL_EXPORTER_OTLP_*`` variable that cannot be used: the message says which."""


@attrs.frozen
class Settings:
    """How to reach the receiver for one signal."""

    headers: Mapping[str, str]
    compression: str
    certificate: str | None
    client_certificate: str | None
    client_key: str | None


def _variable(environ: Mapping[str, str], signal: Signal, name: str) -> tuple[str, str] | None:
    """The signal's own variable if set, else the general one: (its name, its value)."""
    for variable in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def _headers(variable: str, text: str) -> dict[str, str]:
    """``key=value`` pairs separated by commas, URL-encoded (W3C Baggage's format, as
    the OpenTelemetry SDKs read it).

    >>> _headers("V", "Authorization=Bearer%20abc, x-team = blue")
    {'authorization': 'Bearer abc', 'x-team': 'blue'}
    >>> _headers("V", "token")
    Traceback (most recent call last):
    ...
    boxmaker.ledger.otlp_http.SettingProblem: V: 'token' is not key=value
    """
    headers = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        name, equals, value = entry.partition("=")
        name = urllib.parse.unquote(name).strip().lower()
        if not equals or not name:
            raise SettingProblem(f"{variable}: {entry.strip()!r} is not key=value")
        headers[name] = urllib.parse.unquote(value).strip()
    return headers


def settings_of(environ: Mapping[str, str], signal: Signal) -> Settings:
    """The signal's settings from ``environ``. Raises :class:`SettingProblem`."""
    headers = {}
    if (found := _variable(environ, signal, "HEADERS")) is not None:
        headers = _headers(*found)
    compression = "none"
    if (found := _variable(environ, signal, "COMPRESSION")) is not None:
        variable, compression = found[0], found[1].lower()
        if compression not in COMPRESSIONS:
            raise SettingProblem(
                f"{variable}: {found[1]!r} is not one of {', '.join(COMPRESSIONS)}"
            )
    files = [
        _variable(environ, signal, name)
        for name in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY")
    ]
    certificate, client_certificate, client_key = (None if f is None else f[1] for f in files)
    return Settings(headers, compression, certificate, client_certificate, client_key)


@attrs.frozen
class Taken:
    """The receiver took the request; ``rejected`` of its items it did not keep (a
    partial success), with its words (also set, with nothing rejected, for a warning)."""

    rejected: int = 0
    words: str = ""


@attrs.frozen
class Retry:
    """Not taken; try again: after ``wait`` seconds if the receiver said so."""

    words: str
    wait: float | None = None


@attrs.frozen
class Refused:
    """Not taken, and sending it again cannot help."""

    words: str


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` asks for (a number of seconds or an HTTP date), at most
    :data:`RETRY_AFTER_MOST`; None for none or one that cannot be read.

    >>> retry_after("2", 0.0), retry_after("soon", 0.0), retry_after("99999", 0.0)
    (2.0, None, 600.0)
    >>> retry_after("Thu, 01 Jan 1970 00:00:10 GMT", 4.0)
    6.0
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = moment.timestamp() - now
    return min(max(seconds, 0.0), RETRY_AFTER_MOST)


def _text(body: bytes) -> str:
    """A receiver's error body as words: its printable text, cut short. The
    specification's error body is a protobuf ``Status``, whose message is text among
    a few bytes of framing."""
    text = body.decode("utf-8", "replace")
    kept = "".join(ch for ch in text if ch.isprintable() and ch != "\ufffd").strip()
    return printable(kept[:WORDS_MOST])


def _status_words(response: httpx.Response) -> str:
    words = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    if text := _text(response.content):
        words += f": {text}"
    return words


def _taken(signal: Signal, body: bytes) -> Taken:
    """A success's ``partial_success``; a body that is not the response message is a
    plain success (the status said so)."""
    try:
        if signal == "logs":
            logs = ExportLogsServiceResponse.FromString(body).partial_success
            rejected, words = logs.rejected_log_records, logs.error_message
        else:
            spans = ExportTraceServiceResponse.FromString(body).partial_success
            rejected, words = spans.rejected_spans, spans.error_message
    except Exception:  # protobuf's DecodeError, or worse: the status decides
        return Taken()
    return Taken(rejected, printable(words[:WORDS_MOST]))


def _compressed(body: bytes, compression: str) -> tuple[bytes, dict[str, str]]:
    if compression == "gzip":
        return gzip.compress(body, compresslevel=6), {"Content-Encoding": "gzip"}
    if compression == "deflate":
        return zlib.compress(body), {"Content-Encoding": "deflate"}
    return body, {}


class SignalClient:
    """POSTs one signal's request bodies to ``endpoint`` and reads the answers."""

    def __init__(self, endpoint: str, signal: Signal, settings: Settings, timeout: float) -> None:
        self.endpoint = endpoint
        self.signal = signal
        self.settings = settings
        self.headers = {
            **settings.headers,
            "Content-Type": PROTOBUF,
            "User-Agent": f"boxmaker/{__version__}",
        }
        self.client = httpx.AsyncClient(verify=self._tls(), timeout=timeout, follow_redirects=False)

    def _tls(self) -> ssl.SSLContext | bool:
        """The CA and client certificates the settings name. Blocking (reads them)."""
        settings = self.settings
        if settings.certificate is None and settings.client_certificate is None:
            return True
        try:
            context = ssl.create_default_context(cafile=settings.certificate)
            if settings.client_certificate is not None:
                context.load_cert_chain(settings.client_certificate, settings.client_key)
        except (OSError, ssl.SSLError) as exc:
            raise SettingProblem(f"the TLS files for {self.signal}: {exc}") from None
        return context

    async def aclose(self) -> None:
        await self.client.aclose()

    async def post(self, body: bytes) -> Taken | Retry | Refused:
        """Send ``body`` once: what the receiver made of it."""
        content, encoding = _compressed(body, self.settings.compression)
        try:
            response = await self.client.post(
                self.endpoint, content=content, headers=self.headers | encoding
            )
        except httpx.TimeoutException:
            return Retry("no answer in time")
        except httpx.TransportError as exc:
            return Retry(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        if response.is_success:
            return _taken(self.signal, response.content)
        words = _status_words(response)
        if response.status_code in RETRYABLE:
            wait = retry_after(response.headers.get("Retry-After"), time.time())
            return Retry(words, wait)
        return Refused(words)
