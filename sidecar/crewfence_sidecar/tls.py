"""HTTPS for the sidecar: a serving certificate re-read on change, client certificates checked.

Invariants kept here:

* **Rotation needs no restart.** The server's ``SSLContext`` carries an SNI callback that runs
  for every ClientHello (OpenSSL calls it with or without an SNI extension). It compares the
  identity (inode, size, mtime) of the certificate, key and client-CA files with the ones
  loaded last, builds a fresh context when they changed, and hands the connection the newest
  context. A half-written rotation (a certificate that does not match its key yet) is not
  loaded: the connection keeps the previous context and the next handshake tries again.
* **A client certificate from the Crew's CA.** The context verifies a presented client
  certificate against the client-CA file (a certificate of another CA fails the handshake).
  The mode is ``CERT_OPTIONAL`` rather than ``CERT_REQUIRED`` so that ``/health`` and
  ``/metrics`` stay reachable for the kubelet's HTTPS probe and for Prometheus, which present
  no client certificate; every other route answers 401 without a verified client
  certificate (``client_certificate_middleware``), before the bearer token is even looked at.
  One port, one listener: nothing else can be reached by a client without a certificate.
* **Only the current client-CA file counts.** The file may hold several CAs (the Crew's trust
  bundle while its CA is renewed); a certificate of any of them is accepted, and once a CA
  leaves the file, a new handshake with its certificates fails. A *resumed* TLS 1.2 session
  (session id cache; TLS 1.3 tickets are off) would skip that check and keep the peer
  certificate of a handshake made before the change, so a resumed session is not taken as
  a verified client certificate (the operator never resumes sessions; ``/health`` and
  ``/metrics`` need no certificate anyway).
* **Owner-only key.** The private key file obeys the same rule as the token file.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from crewfence_sidecar.contract import error_body
from crewfence_sidecar.credentials import (
    CredentialError,
    FileIdentity,
    check_owner_only,
    identity,
)

log = logging.getLogger("crewfence.sidecar.tls")

CERT_FREE_PATHS: Final = frozenset({"/health", "/metrics"})
"""The only routes a client without a verified certificate reaches (probes, scraping)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: serving certificate (chain), its private key, the CA for client certs."""

    cert: Path
    key: Path
    client_ca: Path

    def check(self) -> None:
        """Presence and file rules, without parsing; raises CredentialError."""
        for path, what in ((self.cert, "CREWFENCE_TLS_CERT_FILE"),
                           (self.client_ca, "CREWFENCE_TLS_CLIENT_CA_FILE")):
            if not path.is_file():
                raise CredentialError(f"{what} {path} is not a readable file")
        check_owner_only(self.key, "CREWFENCE_TLS_KEY_FILE")

    def identities(self) -> tuple[FileIdentity | None, ...]:
        return (identity(self.cert), identity(self.key), identity(self.client_ca))


def build_server_context(files: TlsFiles) -> ssl.SSLContext:
    """A TLS >= 1.2 server context; raises CredentialError with a printable message."""
    files.check()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_OPTIONAL
    # No TLS 1.3 session tickets: every connection proves its client certificate afresh, so
    # a rotated client CA takes effect on the next connection.
    ctx.num_tickets = 0
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        raise CredentialError(f"CREWFENCE_TLS_CERT_FILE/KEY_FILE cannot be loaded "
                              f"({type(exc).__name__}: {getattr(exc, 'reason', None) or exc})"
                              ) from None
    try:
        ctx.load_verify_locations(cafile=str(files.client_ca))
    except (ssl.SSLError, OSError) as exc:
        raise CredentialError(f"CREWFENCE_TLS_CLIENT_CA_FILE {files.client_ca} cannot be "
                              f"loaded ({type(exc).__name__})") from None
    return ctx


class ReloadingServerTLS:
    """The listener's SSLContext; each handshake gets the context of the newest good files."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._seen = files.identities()
        self._current = build_server_context(files)
        self.reloads = 0
        # The listener's context only dispatches: it loads the same files so that a client
        # is never served by a context without a certificate.
        self.context = build_server_context(files)
        self.context.sni_callback = self._on_hello

    def current(self) -> ssl.SSLContext:
        """The newest good context, reloading first when a file changed."""
        seen = self.files.identities()
        if seen != self._seen:
            try:
                fresh = build_server_context(self.files)
            except CredentialError as exc:
                # Mid-rotation (certificate and key from different generations) or a bad
                # file: keep serving with the previous context; retried on the next hello.
                log.warning("TLS files changed but cannot be loaded yet; previous certificate "
                            "stays", extra={"reason": str(exc)})
            else:
                self._current = fresh
                self._seen = seen
                self.reloads += 1
                log.info("TLS certificate reloaded", extra={"reloads": self.reloads})
        return self._current

    def _on_hello(self, conn: Any, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        conn.context = self.current()


def has_verified_client_certificate(request: web.Request) -> bool:
    """True when the connection presented a client certificate that the handshake verified.

    Under ``CERT_OPTIONAL`` an unverifiable certificate fails the handshake, so a non-empty
    ``peercert`` here is a verified one, unless the session was resumed: then the
    certificate was verified against the client-CA file of an earlier handshake, which may
    have dropped its CA since.
    """
    transport = request.transport
    if transport is None or transport.get_extra_info("sslcontext") is None:
        return False
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None or ssl_object.session_reused:
        return False
    return bool(transport.get_extra_info("peercert"))


def client_certificate_middleware(
    on_reject: Callable[[str], None] | None = None,
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """401 for every route but /health and /metrics without a verified client certificate."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in CERT_FREE_PATHS or has_verified_client_certificate(request):
            return await handler(request)
        if on_reject is not None:
            on_reject("client_certificate_required")
        body = error_body("client_certificate_required",
                          "a client certificate from the Crew's CA is required")
        return web.Response(status=401, text=json.dumps(body), content_type="application/json",
                            headers={"WWW-Authenticate": 'Bearer realm="crewfence"'})

    return middleware
