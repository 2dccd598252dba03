"""The MCP servers of a declarative crew as both processes see them, without crewai: their
definition and their headers (read from files at each use, never logged or journaled).

The job's worker builds the tools with crewai's client (``mcp_tools``); the sidecar's main
process lists a server's tools at admission (``server_lists``). Both read the headers here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from crewfence_sidecar.contract import ToolSetupError

TRANSPORTS = ("streamable-http", "sse")


class MCPToolError(ToolSetupError):
    """An MCP server that cannot be reached or lacks a tool the crew names."""


@dataclass(frozen=True)
class MCPServerDefinition:
    name: str
    url: str
    transport: str = "streamable-http"
    headers_file: str | None = None
    headers_dir: str | None = None
    allowed_tools: tuple[str, ...] | None = None
    """None: every tool the server lists."""
    extra_headers: dict[str, str] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        """The configured headers (from ``headers_file``, read now)."""
        headers = dict(self.extra_headers)
        if self.headers_file is not None:
            headers.update(read_headers_file(Path(self.headers_file)))
        if self.headers_dir is not None:
            headers.update(read_headers_dir(Path(self.headers_dir)))
        return headers


def read_headers_dir(path: Path) -> dict[str, str]:
    """A mounted Secret: each regular file is a header (its name) and its value (its content,
    one trailing newline dropped). Kubernetes' own entries (``..data``, ``..<timestamp>``)
    and other dot files are skipped; the message never shows values."""
    try:
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise MCPToolError(f"cannot read headers directory {path}: {exc.strerror}") from None
    headers: dict[str, str] = {}
    for entry in entries:
        if not entry.is_file():
            continue
        try:
            value = entry.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise MCPToolError(f"cannot read header file {entry.name} in {path}") from None
        value = value[:-1] if value.endswith("\n") else value
        if "\n" in value or "\r" in value:
            raise MCPToolError(f"header {entry.name} in {path} spans several lines")
        headers[entry.name] = value
    return headers


def read_headers_file(path: Path) -> dict[str, str]:
    """A YAML/JSON mapping of header name -> value; the message never shows values."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MCPToolError(f"cannot read headers file {path}: {exc.strerror}") from None
    except yaml.YAMLError:
        raise MCPToolError(f"headers file {path} is not a YAML/JSON mapping") from None
    if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in loaded.items()):
        raise MCPToolError(f"headers file {path} must map header names to strings")
    return {k: str(v) for k, v in loaded.items()}
