"""What the probe's ServerApp and ClientApp try (each raises ProbeError when a check fails)."""

from __future__ import annotations

import ctypes
import os
import socket
from pathlib import Path


class ProbeError(Exception):
    """Fails the run (not a RuntimeError: see examples/fedavg/fedavg_app/server_app.py)."""


def connects(address: str) -> str | None:
    """None when a TCP connection to `address` opens within 3 s, else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
            return None
    except OSError as error:
        return str(error) or type(error).__name__


def network(who: str, reached: str, refused: str) -> list[str]:
    """Every address of `reached` connects, none of `refused` does (space-separated lists)."""
    said = []
    for address in reached.split():
        why = connects(address)
        if why is not None:
            raise ProbeError(f"probe: {address} must be reachable but is not ({why})")
        said.append(f"{address} reached")
    for address in refused.split():
        why = connects(address)
        if why is None:
            raise ProbeError(f"probe: {address} is reachable from a {who}")
        said.append(f"{address} refused ({why})")
    return said


def hidden(who: str, path: str) -> str:
    """`path` (a hub secret) cannot be read."""
    try:
        Path(path).read_bytes()
    except OSError as error:
        return f"{path} is hidden ({error})"
    raise ProbeError(f"probe: {path} is readable from a {who}")


def confined(who: str, host_pid: str, hidden_path: str, own_dir: str) -> list[str]:
    """Runs unprivileged, alone in a PID namespace, unable to see, signal or enter the hub's
    process `host_pid`, to read `hidden_path` through `/proc/PID/root`, to unmount `own_dir` or
    to enter a network namespace."""
    said = []
    if os.getuid() == 0 or os.geteuid() == 0:
        raise ProbeError(f"probe: a {who} runs as root")
    status = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
    )
    if int(status["CapEff"].strip(), 16) != 0 or int(status["CapBnd"].strip(), 16) != 0:
        raise ProbeError(f"probe: capabilities {status['CapEff'].strip()}")
    if status.get("NoNewPrivs", "").strip() != "1":
        raise ProbeError("probe: no_new_privs is not set")
    said.append(f"uid {os.getuid()}, no capability, no_new_privs")
    pids = [d for d in os.listdir("/proc") if d.isdigit()]
    if host_pid in pids or len(pids) > 20:
        raise ProbeError(f"probe: sees {len(pids)} processes, the hub's {host_pid} among them")
    try:
        os.kill(int(host_pid), 0)
        raise ProbeError(f"probe: signalled the hub's process {host_pid}")
    except OSError as error:
        said.append(f"the hub's process cannot be signalled ({error})")
    for path in [f"/proc/{host_pid}/root{hidden_path}", f"/proc/1/root{hidden_path}"]:
        try:
            Path(path).read_bytes()
            raise ProbeError(f"probe: read {path}")
        except OSError as error:
            said.append(f"{path} unreadable ({error})")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(own_dir.encode(), 0) == 0:
        raise ProbeError(f"probe: unmounted {own_dir}")
    said.append(f"cannot unmount {own_dir} (errno {ctypes.get_errno()})")
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) == 0:  # CLONE_NEWNET
            raise ProbeError("probe: entered a network namespace")
        said.append(f"cannot enter a network namespace (errno {ctypes.get_errno()})")
    finally:
        os.close(fd)
    return said
