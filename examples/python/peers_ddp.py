"""PyTorch DDP training with prestage's peer tier: NCCL (or Gloo on CPU) for the gradients, MPI for the
data. Each sample is read from the parallel file system once per job; later epochs fetch the samples
another node staged from that node over MPI.

    mpirun -np 4 python examples/python/peers_ddp.py --stage-dir /local/ssd/stage
    srun --nodes 2 --ntasks-per-node 4 python examples/python/peers_ddp.py --stage-dir /local/ssd/stage
    # one host pretending to be 2 nodes behind a slow PFS (what the tests do; as root, Open MPI's
    # mpirun also needs --allow-run-as-root):
    mpirun --oversubscribe -np 4 python examples/python/peers_ddp.py --stage-dir /tmp/stage \
        --emulate-nodes 2 --slow-pfs 40,5

The tier sends each read of another node's copy to that node's link or to the PFS, whichever its
measured estimates expect to finish first. On one host the "PFS" is the local disk, far faster than
MPI between processes, so without --slow-pfs it reads the PFS and fetches nothing from peers;
--slow-pfs MS,MBS serves the set through prestage-pfs, the FUSE-emulated parallel file system
(MS milliseconds per operation, MBS MB/s in all), as a busy PFS would. After each epoch rank 0
prints what the tier learned of each source and how many reads it sent to the PFS instead.

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
    p.add_argument("--slow-pfs", default=None, metavar="MS,MBS",
                   help="with --emulate-nodes: serve the set through the emulated PFS, MS ms per "
                        "operation and MBS MB/s in all (needs FUSE and prestage-pfs)")
    args = p.parse_args()
    if args.slow_pfs and not args.emulate_nodes:
        p.error("--slow-pfs emulates a PFS on one host: it needs --emulate-nodes")

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
    pfs = None
    if rank == 0:
        make_synthetic_set(train_dir, images=args.images, classes=10, seed=0, overwrite=True)
        if args.slow_pfs:
            from prestage.bench.emulator import PfsEmulator

            latency_ms, mbs = (float(v) for v in args.slow_pfs.split(","))
            pfs = PfsEmulator(train_dir, latency_ms=latency_ms, bandwidth_mbs=mbs, max_ops=16)
            pfs.start()
    # Every rank reads the set where rank 0 serves it (one host: the same mount point for all).
    where = [str(pfs.mountpoint) if pfs is not None else str(train_dir)]
    dist.broadcast_object_list(where, src=0)
    catalog = prestage.Catalog.from_folder(where[0])

    # Every rank creates its loader together: starting the peer tier is collective over MPI.
    loader = prestage.torch.Loader(catalog, args.batch_size, (64, 64), stage_dir=stage_dir,
                                   rank=rank, world_size=world, peers=True, peer_timeout=2.0)
    stats = loader.stats(epochs="all")
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
        figures = {e["epoch"]: e for e in loader.stats(epochs="all")["epochs"]}[epoch]
        io = torch.tensor([figures["bytes_from_source"], figures["bytes_from_peers"]], device=device,
                          dtype=torch.float64)
        dist.all_reduce(total)
        dist.all_reduce(io)
        if rank == 0:
            print(f"epoch {epoch}: loss {total[0].item() / total[1].item():.3f}; "
                  f"PFS {io[0].item() / 1e6:.1f} MB, peers {io[1].item() / 1e6:.1f} MB")
            print("  " + why_this_source(loader.stats()))
    dist.barrier()  # every rank answers its peers until all are done
    loader.close()
    dist.barrier()  # every loader closed: no read of the mount is under way
    if pfs is not None:
        pfs.stop()
    dist.destroy_process_group()


def why_this_source(stats: dict) -> str:
    """Rank 0's view of its sources (stats()["sources"]): what the tier learned of each, from which it
    sends each read of another node's copy where it expects it to finish first."""
    if not stats["peer_tier"]:
        return f"peer tier off: {stats['peer_tier_why']}"
    learned = ", ".join(f"{s['name']} {s['mbs']:.1f} MB/s + {s['latency_ms']:.1f} ms ({s['reads']} reads)"
                        for s in stats["sources"])
    return (f"rank 0 so far: {stats['peer_reads']} reads from peers, {stats['peer_reads_to_pfs']} sent "
            f"to the PFS as the faster; learned: {learned}")


if __name__ == "__main__":  # make_synthetic_set starts worker processes
    main()
