"""Secret files the sidecar reads and re-reads: bearer tokens (one or several) and private keys.

Invariants kept here:

* **Owner-only secrets.** A token file, a private key or an LLM API key file is a regular
  file (a Secret volume's symlink to one is fine) whose mode has no group or other bits
  (0600 or 0400). The one exception is the kubelet's own projection: a Secret volume in a pod
  with an ``fsGroup`` (which the journal's claim needs) holds files owned by root, group
  fsGroup, mode ``defaultMode | 0440``; a non-root container can read a root-owned file only
  through its group, so a ROOT-owned file may also carry group-read (0640/0440), never
  group-write and never any bit for others. This is PostgreSQL's rule for its server key,
  for the same reason, and it lets the kubelet's atomic Secret updates (rotation) reach the
  process with no copy step. Checked at start-up (a refusal) and on every reload (a rejected
  reload keeps the last good value).
* **Rotation without a gap.** A token file may hold several tokens, one per line; every one
  of them is accepted. Whoever rolls the token writes ``new`` and ``old`` first, switches its
  clients to ``new``, then removes ``old``: at no moment is the token the client sends
  rejected. The file is re-read when its identity (inode, size, mtime) changes, so neither
  step needs a restart.
* **No secret in a message.** Errors name the file and the rule, never the content.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger("crewfence.sidecar.credentials")

MAX_TOKENS: Final = 8
MAX_TOKEN_FILE_BYTES: Final = 64 * 1024


class CredentialError(Exception):
    """A secret file breaks a rule; the message is safe to print (no secret in it)."""


FileIdentity = tuple[int, int, int, int]


def identity(path: Path) -> FileIdentity | None:
    """What changes when the file is replaced or rewritten; None when it is missing."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def secret_mode_ok(mode: int, owner_uid: int) -> bool:
    """Owner-only; or, for a root-owned file (the kubelet's Secret projection), group-read."""
    if mode & 0o077 == 0:
        return True
    return owner_uid == 0 and mode & 0o037 == 0


def check_owner_only(path: Path, what: str) -> None:
    """Regular file (symlinks followed) whose mode passes ``secret_mode_ok``; else
    CredentialError."""
    try:
        st = path.stat()
    except OSError as exc:
        raise CredentialError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CredentialError(f"{what} {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if not secret_mode_ok(mode, st.st_uid):
        raise CredentialError(f"{what} {path} must have mode 0600 (0640 if owned by root, as a "
                              f"Secret volume under fsGroup), has {mode:04o}")


def read_secret_file(path: Path, what: str, limit: int = MAX_TOKEN_FILE_BYTES) -> str:
    """The stripped UTF-8 text of a secret file that obeys the rule (e.g. an LLM API key)."""
    check_owner_only(path, what)
    try:
        with path.open("rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise CredentialError(f"{what} {path}: {exc.strerror}") from None
    if len(raw) > limit:
        raise CredentialError(f"{what} {path} is larger than {limit} bytes")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CredentialError(f"{what} {path} cannot be read as UTF-8") from None
    if not text:
        raise CredentialError(f"{what} {path} is empty")
    return text


def parse_tokens(text: str, what: str) -> tuple[str, ...]:
    """Non-blank lines, each one printable-ASCII token without spaces."""
    tokens = tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))
    if not tokens:
        raise CredentialError(f"{what} is empty")
    if len(tokens) > MAX_TOKENS:
        raise CredentialError(f"{what} holds more than {MAX_TOKENS} tokens")
    for token in tokens:
        if any(ord(ch) < 0x21 or ord(ch) > 0x7E for ch in token):
            raise CredentialError("the bearer token must be printable ASCII without spaces")
    return tokens


def read_token_file(path: Path, what: str = "CREWFENCE_TOKEN_FILE") -> tuple[str, ...]:
    """All tokens of an owner-only token file (one per line)."""
    return parse_tokens(read_secret_file(path, what), f"{what} {path}")


@dataclass
class TokenSource:
    """The accepted bearer tokens: fixed, or a token file re-read when it changes."""

    fixed: tuple[bytes, ...] = field(default=(), repr=False)
    path: Path | None = None
    _tokens: tuple[bytes, ...] = field(default=(), repr=False)
    _seen: FileIdentity | None = None

    @classmethod
    def from_token(cls, token: str) -> TokenSource:
        return cls(fixed=(token.encode("ascii"),))

    @classmethod
    def from_file(cls, path: Path) -> TokenSource:
        """Reads the file now: raises CredentialError when it breaks a rule."""
        source = cls(path=path)
        source._seen = identity(path)
        source._tokens = tuple(t.encode("ascii") for t in read_token_file(path))
        return source

    def current(self) -> tuple[bytes, ...]:
        """The tokens to accept now; a changed file is re-read first (a bad one is ignored)."""
        if self.path is None:
            return self.fixed
        seen = identity(self.path)
        if seen is not None and seen != self._seen:
            try:
                self._tokens = tuple(t.encode("ascii") for t in read_token_file(self.path))
            except CredentialError as exc:
                log.warning("token file change ignored; the previous tokens stay",
                            extra={"reason": str(exc)})
            else:
                log.info("token file reloaded", extra={"tokens": len(self._tokens)})
            self._seen = seen
        return self._tokens


def matches(presented: bytes, accepted: tuple[bytes, ...]) -> bool:
    """Constant-time comparison against every accepted token (no early exit)."""
    ok = False
    for token in accepted:
        ok |= hmac.compare_digest(presented, token)
    return ok and bool(presented)


def owner_only_or_refuse(path: Path, what: str) -> Path:
    """check_owner_only for configuration: returns the absolute path."""
    check_owner_only(path, what)
    return Path(os.path.abspath(path))
