"""flower-addon test app: what code run through `flwr run` can read on the hub machine."""
