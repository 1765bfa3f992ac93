"""flower-addon example Flower app: FedAvg on synthetic linear regression (numpy only)."""
