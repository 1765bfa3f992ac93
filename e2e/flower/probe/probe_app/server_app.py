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
- ClientApps: with `probe-client-refused` or `probe-client-host-pid` set, it sends a `query`
  to every SuperNode of the Federation, whose ClientApp checks the same from its side
  (`client_app.py`); an error or a missing reply fails the run;
- the hub's bounds: with `probe-raise-bytes` set it fails with a message that long, full of
  terminal escapes (the hub must keep its status bounded and clean); with `probe-sparse-bytes`
  set it leaves a sparse file that large in its `output-dir` (the hub must refuse to list it, not
  read it);
- time: with `probe-wait-for` set, it runs until that file exists (at most 10 minutes), so a
  test can hold a run in progress for as long as it needs.

It completes when every check holds, printing what it tried."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from probe_app import checks
from probe_app.checks import ProbeError

app = ServerApp()


def _say(lines: list[str]) -> None:
    for line in lines:
        print(f"probe: {line}", flush=True)


def _files(context: Context) -> None:
    hidden_text = str(context.run_config.get("probe-hidden", ""))
    own_text = str(context.run_config.get("probe-own", ""))
    if not hidden_text and not own_text:
        return
    if not Path(own_text).is_file():
        raise ProbeError(f"probe: its own file {own_text} is not visible")
    _say([checks.hidden("ServerApp", hidden_text)])


def _confined(context: Context) -> None:
    host_pid = str(context.run_config.get("probe-host-pid", ""))
    if not host_pid:
        return
    hidden = str(context.run_config.get("probe-hidden", ""))
    own_dir = str(Path(str(context.run_config.get("probe-own", "/"))).parent.parent)
    _say(checks.confined("ServerApp", host_pid, hidden, own_dir))


def _network(context: Context) -> None:
    _say(
        checks.network(
            "ServerApp",
            str(context.run_config.get("probe-reached", "")),
            str(context.run_config.get("probe-refused", "")),
        )
    )


def _clients(grid: Grid, context: Context) -> None:
    if not str(context.run_config.get("probe-client-refused", "")) and not str(
        context.run_config.get("probe-client-host-pid", "")
    ):
        return
    deadline = time.monotonic() + 120
    node_ids = sorted(grid.get_node_ids())
    while not node_ids:
        if time.monotonic() > deadline:
            raise ProbeError("probe: no SuperNode connected within 2 minutes")
        time.sleep(1)
        node_ids = sorted(grid.get_node_ids())
    messages = [
        Message(content=RecordDict(), dst_node_id=node_id, message_type=MessageType.QUERY)
        for node_id in node_ids
    ]
    replies = list(grid.send_and_receive(messages, timeout=180))
    errors = [r for r in replies if r.has_error()]
    if errors:
        raise ProbeError(
            "probe: "
            + "; ".join(
                f"ClientApp of node {r.metadata.src_node_id}: {r.error.reason}" for r in errors
            )
        )
    if len(replies) < len(node_ids):
        raise ProbeError(f"probe: {len(replies)} ClientApp replies from {len(node_ids)} nodes")
    for reply in replies:
        said = reply.content["probe"]["said"]
        print(f"probe: ClientApp of node {reply.metadata.src_node_id}: {said}", flush=True)


def _hostile(context: Context) -> None:
    sparse = int(context.run_config.get("probe-sparse-bytes", 0))
    if sparse:
        output_dir = Path(str(context.run_config.get("output-dir", "")))
        # The directory may not exist yet: the app makes it (the hub gives only its path).
        output_dir.mkdir(parents=True, exist_ok=True)
        with open(output_dir / "sparse.bin", "wb") as file:
            file.truncate(sparse)
        print(f"probe: left a sparse file of {sparse} bytes in {output_dir}", flush=True)
    loud = int(context.run_config.get("probe-raise-bytes", 0))
    if loud:
        raise ProbeError("probe: \x1b[31mloud\x1b[0m " + "\x07x" * (loud // 2))


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
    _clients(grid, context)
    _hostile(context)
    _wait(context)
