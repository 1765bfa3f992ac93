"""Deterministic synthetic linear-regression task shared by the ServerApp and ClientApp."""

from __future__ import annotations

import numpy as np

NUM_FEATURES = 4
# Ground truth every partition is drawn from; FedAvg should recover it.
TRUE_WEIGHTS = np.array([2.0, -3.0, 0.5, 1.0], dtype=np.float64)
TRUE_BIAS = 0.25


def initial_parameters() -> list[np.ndarray]:
    """Global model at round 0: zeros."""
    return [np.zeros(NUM_FEATURES, dtype=np.float64), np.zeros(1, dtype=np.float64)]


def load_partition(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """Make partition `partition_id` of `num_partitions` deterministically (no download).

    Each partition has its own input distribution (shifted mean) and size, so the
    federated average is a real weighted average.
    """
    if num_partitions < 1 or not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"invalid node config: partition-id={partition_id} num-partitions={num_partitions}"
        )
    rng = np.random.default_rng(seed=1000 + 7919 * num_partitions + partition_id)
    n = 64 + 16 * partition_id
    shift = (partition_id - (num_partitions - 1) / 2.0) * 0.5
    x = rng.normal(loc=shift, scale=1.0, size=(n, NUM_FEATURES))
    y = x @ TRUE_WEIGHTS + TRUE_BIAS + rng.normal(scale=0.1, size=n)
    return x, y


def mse(params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    w, b = params
    err = x @ w + b[0] - y
    return float(np.mean(err * err))


def train(
    params: list[np.ndarray], x: np.ndarray, y: np.ndarray, steps: int, lr: float
) -> list[np.ndarray]:
    """Full-batch gradient descent on the mean squared error."""
    w = params[0].astype(np.float64).copy()
    b = params[1].astype(np.float64).copy()
    n = x.shape[0]
    for _ in range(steps):
        err = x @ w + b[0] - y
        w -= lr * (2.0 / n) * (x.T @ err)
        b -= lr * (2.0 / n) * np.sum(err)
    return [w, b]
