"""The distributed engine's data plane: what travels between the parties' processes."""
