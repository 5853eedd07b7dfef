"""Your own model, loss and DataLoader, trained serverless with slate.optim.SLATE.

Every process is one party holding its own shard of the data; no raw data leaves a process.
Launch 4 parties on this machine (rendezvous on loopback):

    torchrun --nproc-per-node 4 --master-addr 127.0.0.1 --master-port 29500 \\
        examples/own_training_loop.py --steps 400

On several machines, run the same command on each with ``--nnodes``, ``--node-rank`` and the
address of the first machine as ``--master-addr`` (see the README).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.metrics import average_precision_score
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import slate.optim
from slate import APLoss


class PositivesFirstSampler(Sampler[list[int]]):
    """Batches of ``b`` positives and ``m - b`` negatives, so APLoss always has positives."""

    def __init__(self, labels: torch.Tensor, m: int, b: int, steps: int, seed: int) -> None:
        self.pos = torch.nonzero(labels == 1).flatten()
        self.neg = torch.nonzero(labels == 0).flatten()
        self.m, self.b, self.steps = m, b, steps
        self.gen = torch.Generator().manual_seed(seed)

    def __iter__(self):
        for _ in range(self.steps):
            pos = self.pos[torch.randint(len(self.pos), (self.b,), generator=self.gen)]
            neg = self.neg[torch.randint(len(self.neg), (self.m - self.b,), generator=self.gen)]
            yield torch.cat([pos, neg]).tolist()

    def __len__(self) -> int:
        return self.steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()

    # This party's own data: every world-th example of digits (classes 5-9 are positive).
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target >= 5, dtype=torch.long)
    test_x, test_y = x[:400], y[:400]
    mine = torch.arange(400 + rank, len(y), world)
    shard = TensorDataset(x[mine], y[mine])
    loader = DataLoader(
        shard, batch_sampler=PositivesFirstSampler(y[mine], 20, 4, args.steps, rank)
    )

    torch.manual_seed(0)  # every party starts from the same weights
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = slate.optim.SLATE(model.parameters(), lr=args.lr, topology="ring")
    loss_fn = APLoss(margin=0.5)

    for features, labels in loader:
        optimizer.zero_grad()
        loss = loss_fn(torch.sigmoid(model(features).squeeze(-1)), labels)
        loss.backward()
        optimizer.step()  # local step, then one exchange with the two ring neighbours

    # The output model is the average of all parties' models.
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    dist.all_reduce(flat)
    torch.nn.utils.vector_to_parameters(flat / world, model.parameters())
    if rank == 0:
        with torch.no_grad():
            scores = model(test_x).squeeze(-1)
        print(f"test AP of the averaged model: {average_precision_score(test_y, scores):.4f}")
    dist.barrier()  # leave together: no party tears down while another still talks to it
    # gloo's background threads can abort the interpreter's shutdown after a run ("terminate
    # called without an active exception"); everything is written, so leave directly.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
