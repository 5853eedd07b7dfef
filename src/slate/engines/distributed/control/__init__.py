"""The distributed engine's control plane: who is in the run, through the rendezvous store."""
