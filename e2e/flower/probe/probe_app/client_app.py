"""A ClientApp that does nothing (the probe is the ServerApp)."""

from flwr.clientapp import ClientApp

app = ClientApp()
