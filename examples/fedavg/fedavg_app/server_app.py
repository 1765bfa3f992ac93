"""ServerApp: FedAvg written on the Grid API, strict about failures.

Flower's built-in FedAvg strategy tolerates failed or missing replies silently; a test that
judges a deployment by `finished:completed` needs the run to FAIL instead. So this ServerApp
raises (-> run status `finished:failed`) when fewer than `min-nodes` SuperNodes are connected,
when a round gets any error reply, or when a round gets fewer replies than messages sent.

Works unchanged with Flower 1.25 and 1.42 (`flwr.serverapp.ServerApp`/`Grid`, `flwr.app`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedavg_app.task import TRUE_BIAS, TRUE_WEIGHTS, initial_parameters

app = ServerApp()


class FederationError(Exception):
    """Raised to fail the run.

    Deliberately NOT a RuntimeError: Flower 1.25's flwr-serverapp catches RuntimeError as
    "Failed to start run" (exit code 203) and never updates the run status, so the run would
    stay `running` forever instead of becoming `finished:failed`.
    """


def _say(line: str) -> None:
    # print() reaches `flwr run --stream` / `flwr log` in both dialects.
    print(line, flush=True)
    sys.stderr.flush()


def _wait_for_nodes(grid: Grid, min_nodes: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= min_nodes:
            return node_ids
        if time.monotonic() >= deadline:
            raise FederationError(
                f"only {len(node_ids)} SuperNode(s) connected after {timeout:.0f}s, "
                f"min-nodes={min_nodes}"
            )
        time.sleep(1.0)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    num_rounds = int(cfg.get("num-server-rounds", 3))
    min_nodes = int(cfg.get("min-nodes", 2))
    wait_timeout = float(cfg.get("wait-for-nodes-timeout", 120.0))
    round_timeout = float(cfg.get("round-timeout", 300.0))
    local_steps = int(cfg.get("local-steps", 20))
    lr = float(cfg.get("learning-rate", 0.05))
    output_dir = str(cfg.get("output-dir", ""))

    params = initial_parameters()
    loss = float("nan")
    t0 = time.monotonic()
    for server_round in range(1, num_rounds + 1):
        node_ids = _wait_for_nodes(grid, min_nodes, wait_timeout)
        content = RecordDict(
            {
                "arrays": ArrayRecord(params),
                "config": ConfigRecord(
                    {
                        "server-round": server_round,
                        "local-steps": local_steps,
                        "learning-rate": lr,
                    }
                ),
            }
        )
        messages = [
            Message(
                content=content,
                dst_node_id=node_id,
                message_type=MessageType.TRAIN,
                group_id=str(server_round),
            )
            for node_id in node_ids
        ]
        replies = list(grid.send_and_receive(messages, timeout=round_timeout))

        errors = [r for r in replies if r.has_error()]
        if errors:
            detail = "; ".join(
                f"node {r.metadata.src_node_id}: {r.error.code} {r.error.reason}" for r in errors
            )
            raise FederationError(f"round {server_round}: {len(errors)} failure(s): {detail}")
        if len(replies) < len(node_ids):
            raise FederationError(
                f"round {server_round}: {len(replies)} replies from {len(node_ids)} nodes "
                f"(timeout {round_timeout:.0f}s)"
            )

        # FedAvg: average weighted by num-examples.
        weights, results, losses = [], [], []
        for reply in replies:
            metrics = reply.content["metrics"]
            n = float(metrics["num-examples"])
            weights.append(n)
            results.append(reply.content["arrays"].to_numpy_ndarrays())
            losses.append(float(metrics["train-loss"]))
        total = sum(weights)
        params = [
            sum(w * res[i] for w, res in zip(weights, results)) / total
            for i in range(len(params))
        ]
        loss = sum(w * l for w, l in zip(weights, losses)) / total
        _say(
            f"round {server_round}/{num_rounds}: replies={len(replies)} "
            f"nodes={len(node_ids)} loss={loss:.4f}"
        )

    err = float(np.linalg.norm(params[0] - TRUE_WEIGHTS) + abs(params[1][0] - TRUE_BIAS))
    _say(
        f"final: rounds={num_rounds} loss={loss:.4f} weight-error={err:.4f} "
        f"seconds={time.monotonic() - t0:.1f}"
    )
    if output_dir:
        # The directory may not exist yet: the app makes it (the hub gives only its path).
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "model.npz", weights=params[0], bias=params[1])
        (out / "metrics.json").write_text(
            json.dumps({"rounds": num_rounds, "loss": loss, "weight-error": err}, indent=2) + "\n"
        )
        _say(f"saved: {out / 'model.npz'} and metrics.json")
