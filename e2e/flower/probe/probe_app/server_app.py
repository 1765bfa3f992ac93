"""ServerApp that tries what another tenant's code must not do, and fails the run
(`finished:failed`) when it can:

- files: it must not read `probe-hidden` (a hub secret) and must read `probe-own` (its
  SuperLink's own certificate: a sandbox hiding too much); both empty: no file check;
- network: it must not connect to any of `probe-refused` (another Federation's Control API) and
  must connect to every one of `probe-reached` (proof that the network path is there, so a
  refusal means the port is closed to it, not that nothing is reachable); space-separated
  `host:port` lists, empty: no check;
- privileges: with `probe-host-pid` set (the hub's pid), it must run as a uid other than root
  with no capability and `no_new_privs`, must not see, signal or enter (`/proc/PID/root`) the
  hub's process, must see only a few processes (a PID namespace of its own), and must fail to
  unmount and to enter a network namespace;
- time: with `probe-wait-for` set, it runs until that file exists (at most 10 minutes), so a
  test can hold a run in progress for as long as it needs.

It completes when every check holds, printing what it tried."""

from __future__ import annotations

import ctypes
import os
import socket
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


class ProbeError(Exception):
    """Fails the run (not a RuntimeError: see examples/fedavg/fedavg_app/server_app.py)."""


def _connects(address: str) -> str | None:
    """None when a TCP connection to `address` opens within 3 s, else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
            return None
    except OSError as error:
        return str(error) or type(error).__name__


def _files(context: Context) -> None:
    hidden_text = str(context.run_config.get("probe-hidden", ""))
    own_text = str(context.run_config.get("probe-own", ""))
    if not hidden_text and not own_text:
        return
    hidden, own = Path(hidden_text), Path(own_text)
    if not own.is_file():
        raise ProbeError(f"probe: its own file {own} is not visible")
    try:
        hidden.read_bytes()
    except OSError as error:
        print(f"probe: {hidden} is hidden ({error})", flush=True)
        return
    raise ProbeError(f"probe: {hidden} is readable from a ServerApp")


def _network(context: Context) -> None:
    for address in str(context.run_config.get("probe-reached", "")).split():
        why = _connects(address)
        if why is not None:
            raise ProbeError(f"probe: {address} must be reachable but is not ({why})")
        print(f"probe: {address} reached", flush=True)
    for address in str(context.run_config.get("probe-refused", "")).split():
        why = _connects(address)
        if why is None:
            raise ProbeError(f"probe: {address} is reachable from a ServerApp")
        print(f"probe: {address} refused ({why})", flush=True)


def _confined(context: Context) -> None:
    host_pid = str(context.run_config.get("probe-host-pid", ""))
    if not host_pid:
        return
    if os.getuid() == 0 or os.geteuid() == 0:
        raise ProbeError("probe: a ServerApp runs as root")
    status = dict(
        line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
    )
    if int(status["CapEff"].strip(), 16) != 0 or int(status["CapBnd"].strip(), 16) != 0:
        raise ProbeError(f"probe: capabilities {status['CapEff'].strip()}")
    if status.get("NoNewPrivs", "").strip() != "1":
        raise ProbeError("probe: no_new_privs is not set")
    print(f"probe: uid {os.getuid()}, no capability, no_new_privs", flush=True)
    pids = [d for d in os.listdir("/proc") if d.isdigit()]
    if host_pid in pids or len(pids) > 20:
        raise ProbeError(f"probe: sees {len(pids)} processes, the hub's {host_pid} among them")
    try:
        os.kill(int(host_pid), 0)
        raise ProbeError(f"probe: signalled the hub's process {host_pid}")
    except OSError as error:
        print(f"probe: the hub's process cannot be signalled ({error})", flush=True)
    hidden = str(context.run_config.get("probe-hidden", ""))
    for path in [f"/proc/{host_pid}/root{hidden}", f"/proc/1/root{hidden}"]:
        try:
            Path(path).read_bytes()
            raise ProbeError(f"probe: read {path}")
        except OSError as error:
            print(f"probe: {path} unreadable ({error})", flush=True)
    libc = ctypes.CDLL(None, use_errno=True)
    own_dir = str(Path(str(context.run_config.get("probe-own", "/"))).parent.parent)
    if libc.umount2(own_dir.encode(), 0) == 0:
        raise ProbeError(f"probe: unmounted {own_dir}")
    print(f"probe: cannot unmount {own_dir} (errno {ctypes.get_errno()})", flush=True)
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    if libc.setns(fd, 0x40000000) == 0:  # CLONE_NEWNET
        raise ProbeError("probe: entered a network namespace")
    print(f"probe: cannot enter a network namespace (errno {ctypes.get_errno()})", flush=True)
    os.close(fd)


def _wait(context: Context) -> None:
    wait_for = str(context.run_config.get("probe-wait-for", ""))
    if not wait_for:
        return
    deadline = time.monotonic() + 600
    while not Path(wait_for).exists():
        if time.monotonic() > deadline:
            raise ProbeError(f"probe: {wait_for} did not appear within 10 minutes")
        time.sleep(0.5)
    print(f"probe: {wait_for} appeared", flush=True)


@app.main()
def main(grid: Grid, context: Context) -> None:
    _files(context)
    _confined(context)
    _network(context)
    _wait(context)
