"""PyTorch DDP training with prestage's peer tier: NCCL (or Gloo on CPU) for the gradients, MPI for the
data. Each sample is read from the parallel file system once per job; later epochs fetch the samples
another node staged from that node over MPI.

    mpirun -np 4 python examples/python/peers_ddp.py --stage-dir /local/ssd/stage
    srun --nodes 2 --ntasks-per-node 4 python examples/python/peers_ddp.py --stage-dir /local/ssd/stage
    # one host pretending to be 2 nodes (what the tests do):
    mpirun --oversubscribe -np 4 python examples/python/peers_ddp.py --stage-dir /tmp/stage --emulate-nodes 2

Ranks and world size come from the MPI launcher (mpirun's OMPI_COMM_WORLD_*, or Slurm's SLURM_*);
torch.distributed rendezvous at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500: set MASTER_ADDR to
the first node's address across nodes, e.g. ``$(scontrol show hostnames | head -1)``). Each epoch
prints the loss and, summed over the ranks, the bytes read from the PFS and fetched from peers.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import prestage
import prestage.torch
from prestage.synth import make_synthetic_set


def launcher_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from mpirun's or srun's environment."""
    for prefix, local in (("OMPI_COMM_WORLD_", "OMPI_COMM_WORLD_LOCAL_RANK"), ("SLURM_", "SLURM_LOCALID")):
        if prefix + "RANK" in os.environ or prefix + "PROCID" in os.environ:
            rank = int(os.environ.get(prefix + "RANK", os.environ.get(prefix + "PROCID", 0)))
            world = int(os.environ.get(prefix + "SIZE", os.environ.get(prefix + "NTASKS", 1)))
            return rank, world, int(os.environ.get(local, 0))
    return 0, 1, 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "prestage-examples")
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--stage-dir", type=Path, required=True, help="node-local folder (an SSD)")
    p.add_argument("--emulate-nodes", type=int, default=0,
                   help="split the ranks of one host into this many nodes, each with its own stage dir")
    args = p.parse_args()

    rank, world, local_rank = launcher_rank()
    stage_dir = args.stage_dir
    if args.emulate_nodes:
        node = rank * args.emulate_nodes // world
        os.environ["PRESTAGE_NODE"] = str(node)  # read when the loader starts its peer tier
        stage_dir = stage_dir / f"node{node}"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # NCCL for the gradients (Gloo without a GPU); prestage starts MPI itself for the data.
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)

    train_dir = args.data / f"train-{args.images}-10"
    if rank == 0:
        make_synthetic_set(train_dir, images=args.images, classes=10, seed=0, overwrite=True)
    dist.barrier()
    catalog = prestage.Catalog.from_folder(train_dir)

    # Every rank creates its loader together: starting the peer tier is collective over MPI.
    loader = prestage.torch.Loader(catalog, args.batch_size, (64, 64), stage_dir=stage_dir,
                                   rank=rank, world_size=world, peers=True, peer_timeout=2.0)
    stats = loader.stats()
    if rank == 0:
        print("peer tier:", "on" if stats["peer_tier"] else f"off ({stats['peer_tier_why']})")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10)).to(device)
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for images, labels in loader:
            images = images.to(device, non_blocking=True).float().div_(255)  # (N, 3, 64, 64)
            labels = labels.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(labels), torch.tensor(len(labels), device=device)])
        figures = {e["epoch"]: e for e in loader.stats()["epochs"]}[epoch]
        io = torch.tensor([figures["bytes_from_source"], figures["bytes_from_peers"]], device=device,
                          dtype=torch.float64)
        dist.all_reduce(total)
        dist.all_reduce(io)
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0].item() / total[1].item():.3f}; "
                  f"PFS {io[0].item() / 1e6:.1f} MB, peers {io[1].item() / 1e6:.1f} MB")
    dist.barrier()  # every rank answers its peers until all are done
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":  # make_synthetic_set starts worker processes
    main()
