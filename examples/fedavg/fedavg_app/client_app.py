"""ClientApp: trains on its deterministic synthetic partition.

Uses the Message API (`flwr.clientapp.ClientApp` + `@app.train()`, records from `flwr.app`),
which is the same in Flower 1.25 and 1.42.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedavg_app.task import load_partition, mse, train

app = ClientApp()


def _node_int(context: Context, key: str) -> int:
    try:
        value = context.node_config[key]
    except KeyError as err:
        raise KeyError(
            f"node config has no {key!r}: start the SuperNode with "
            f"--node-config \"partition-id=0 num-partitions=2\" (got {dict(context.node_config)})"
        ) from err
    return int(value)


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    partition_id = _node_int(context, "partition-id")
    num_partitions = _node_int(context, "num-partitions")
    x, y = load_partition(partition_id, num_partitions)

    params = msg.content["arrays"].to_numpy_ndarrays()
    config = msg.content["config"]
    steps = int(config["local-steps"])
    lr = float(config["learning-rate"])

    new_params = train(params, x, y, steps, lr)
    metrics = MetricRecord(
        {
            "num-examples": int(x.shape[0]),
            "train-loss": mse(new_params, x, y),
            "partition-id": partition_id,
        }
    )
    content = RecordDict({"arrays": ArrayRecord(new_params), "metrics": metrics})
    return Message(content=content, reply_to=msg)
