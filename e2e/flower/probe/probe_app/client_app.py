"""ClientApp of the probe: on a `query` message it tries what another tenant's ClientApp must
not do (see `checks.py`) and fails its reply when it can:

- network: it must not connect to any of `probe-client-refused` (another Federation's Control
  API, another Federation's SuperNode's ClientAppIo port); space-separated `host:port` list;
- privileges and files: with `probe-client-host-pid` set (the hub's pid), it must run
  unprivileged alone in a PID namespace, not read `probe-hidden` (directly or through
  `/proc/PID/root`), not unmount its working directory, not enter a network namespace.

It replies with what it tried."""

from __future__ import annotations

import os

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from probe_app import checks

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    said = checks.network(
        "ClientApp", "", str(context.run_config.get("probe-client-refused", ""))
    )
    host_pid = str(context.run_config.get("probe-client-host-pid", ""))
    if host_pid:
        hidden = str(context.run_config.get("probe-hidden", ""))
        said.append(checks.hidden("ClientApp", hidden))
        said += checks.confined("ClientApp", host_pid, hidden, os.getcwd())
    content = RecordDict({"probe": ConfigRecord({"said": "; ".join(said)})})
    return Message(content=content, reply_to=msg)
