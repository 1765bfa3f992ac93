"""ServerApp that tries to read a file it must not see: the run fails (`finished:failed`) when
it can read `probe-hidden`, or when it cannot read `probe-own` (a sandbox hiding too much), and
completes when the hidden file is hidden and its own file is there."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


class ProbeError(Exception):
    """Fails the run (not a RuntimeError: see examples/fedavg/fedavg_app/server_app.py)."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    hidden = Path(str(context.run_config["probe-hidden"]))
    own = Path(str(context.run_config["probe-own"]))
    if not own.is_file():
        raise ProbeError(f"probe: its own file {own} is not visible")
    try:
        hidden.read_bytes()
    except OSError as error:
        print(f"probe: {hidden} is hidden ({error})", flush=True)
        return
    raise ProbeError(f"probe: {hidden} is readable from a ServerApp")
