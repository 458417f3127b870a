"""Host ends of the VM's sockets: JSON lines to the guest agent, and QMP to qemu itself.

Both read with a deadline and give up as soon as qemu is gone, so a dead or wedged guest turns
into an exception instead of a hung test run.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import VmError

SLICE = 0.25  # how often a waiting read checks that qemu is still alive


class Closed(VmError):
    """The peer closed the socket (qemu exited)."""


class Expired(VmError):
    """No complete reply arrived before the deadline."""


class JsonLines:
    """A Unix-socket connection that exchanges one JSON object per line."""

    def __init__(self, path: Path, alive: Callable[[], bool], connect_timeout: float = 30) -> None:
        self._alive = alive
        self._buffer = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if not alive() or time.monotonic() > deadline:
                    self.sock.close()
                    raise Closed(f"qemu never opened {path}") from None
                time.sleep(0.02)

    def send(self, message: dict[str, Any]) -> None:
        """Write one message."""
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise Closed(f"qemu closed the socket: {exc}") from exc

    def receive(self, timeout: float) -> dict[str, Any]:
        """Read the next message, waiting at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Expired(f"no reply within {timeout:g} s")
            ready, _, _ = select.select([self.sock], [], [], min(SLICE, remaining))
            if not ready:
                if not self._alive():
                    raise Closed("qemu exited")
                continue
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError as exc:
                raise Closed(f"qemu closed the socket: {exc}") from exc
            if not chunk:
                raise Closed("qemu closed the socket")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class Agent:
    """Requests to the guest agent (see agent.py), matched to replies by id."""

    def __init__(self, lines: JsonLines) -> None:
        self.lines = lines
        self._next = 0

    def request(self, op: str, wait: float, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply."""
        self._next += 1
        self.lines.send({"id": self._next, "op": op, **fields})
        while True:
            reply = self.lines.receive(wait)
            if reply.get("id") == self._next:
                return reply


class Qmp:
    """A QMP session: capabilities negotiated, asynchronous events kept in `events`."""

    def __init__(self, lines: JsonLines, timeout: float = 10) -> None:
        self.lines = lines
        self.events: list[dict[str, Any]] = []
        self.lines.receive(timeout)  # the greeting
        self.execute("qmp_capabilities")

    def execute(self, command: str, timeout: float = 30, **arguments: Any) -> Any:
        """Run a QMP command and return its `return` value; a QMP error raises VmError."""
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        self.lines.send(message)
        while True:
            reply = self.lines.receive(timeout)
            if "event" in reply:
                self.events.append(reply)
            elif "error" in reply:
                error = reply["error"]
                raise VmError(f"QMP {command} failed: {error.get('class')}: {error.get('desc')}")
            elif "return" in reply:
                return reply["return"]
