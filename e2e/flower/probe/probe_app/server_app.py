"""ServerApp that tries what another tenant's code must not do, and fails the run
(`finished:failed`) when it can:

- files: it must not read `probe-hidden` (a hub secret) and must read `probe-own` (its
  SuperLink's own certificate: a sandbox hiding too much); both empty: no file check;
- network: it must not connect to any of `probe-refused` (another Federation's Control API) and
  must connect to every one of `probe-reached` (proof that the network path is there, so a
  refusal means the port is closed to it, not that nothing is reachable); space-separated
  `host:port` lists, empty: no check;
- time: with `probe-wait-for` set, it runs until that file exists (at most 10 minutes), so a
  test can hold a run in progress for as long as it needs.

It completes when every check holds, printing what it tried."""

from __future__ import annotations

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
    _network(context)
    _wait(context)
