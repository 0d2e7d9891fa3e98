"""prestage simulate: the peer tier at scale, from the plan alone (no data, no MPI).

For each node count and aggregate cache size (a fraction of the set, split evenly over the nodes) it
follows every sample use of --epochs epochs of the real plan through two policies: without the peer tier
(each node's stage directory under Belady's rule over its own stream, every miss a PFS read) and with it
(a miss is fetched over the interconnect from the sample's owner node while that node holds it, else
read from the PFS). With the tier on, each node's directory is run as without it ("own first") while
its link is slower than its share of the PFS (--link-gbs <= --pfs-gbs / nodes), else "home first": the
samples it holds for the other nodes (its home copies) rank ahead of its own next uses. Per row: the
layout, PFS bytes per epoch with and without peers, peer bytes per node, the imbalance of peer traffic
between nodes (max/mean), and the I/O time an epoch needs at least on the PFS (--pfs-gbs, aggregate)
and on the busiest node's link (--link-gbs, each direction), and which binds; and the time with the
tier's per-read rule (each read of another node's home copy to that link or to the PFS, whichever is
expected to finish first) against the tier off. See prestage.bench.simulate for the exact rules.

  prestage simulate --nodes 1-1024 --ranks-per-node 4 --cache 25,50,100 --epochs 3 --out results/

Sample sizes: lognormal with mean --sample-bytes and shape --size-sigma, seeded by --seed (0: all equal).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prestage.bench.session import note, positive
from prestage.cli import summary
from prestage.cli.progress import progress

IMAGENET_TRAIN = 1_281_167

#: Sample uses a second, whole study (plan, walks and the peer rule), one core: what the estimate
#: printed before a study assumes. Measured on a 2-core development machine: 3.6 million uses in 19 s
#: (--nodes 1-8 --samples 100000), 0.72 million in 3.5 s. Pure Python: about the same rate at every
#: size, so the run time grows with nodes x caches x epochs x samples (the defaults: 208 million
#: uses, about 20 minutes).
USES_PER_S = 180_000


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help=summary("simulate"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", default="1-1024", metavar="SPEC",
                   help="node counts: a range of powers of two (1-1024, the default) or a list (1,2,8)")
    p.add_argument("--ranks-per-node", type=positive, default=4, metavar="R", help="default 4")
    p.add_argument("--samples", type=positive, default=IMAGENET_TRAIN, metavar="N",
                   help=f"samples in the set (default {IMAGENET_TRAIN}, ImageNet-1k's training set)")
    p.add_argument("--sample-bytes", type=float, default=110e3, metavar="B",
                   help="mean sample size in bytes (default 110e3)")
    p.add_argument("--size-sigma", type=float, default=0.5, metavar="S",
                   help="shape of the lognormal sample sizes; 0: all equal (default 0.5)")
    p.add_argument("--cache", default="25,50,100", metavar="LIST",
                   help="aggregate cache sizes, percent of the set (default 25,50,100)")
    p.add_argument("--epochs", type=positive, default=3, metavar="E", help="default 3")
    p.add_argument("--batch-size", type=positive, default=32, metavar="B", help="per rank (default 32)")
    p.add_argument("--seed", type=int, default=0, help="the plan's seed and the sizes' (default 0)")
    p.add_argument("--pfs-gbs", type=float, default=100.0, metavar="GB/s",
                   help="PFS aggregate bandwidth (default 100)")
    p.add_argument("--link-gbs", type=float, default=12.5, metavar="GB/s",
                   help="per-node interconnect bandwidth, each direction (default 12.5)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write simulate.json, simulate.md and simulate.png to DIR")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    from prestage.bench import simulate as sim

    try:
        nodes = sim.parse_nodes(args.nodes)
        caches = sim.parse_caches(args.cache)
        config = sim.Config(num_samples=args.samples, ranks_per_node=args.ranks_per_node,
                            batch_size=args.batch_size, epochs=args.epochs, seed=args.seed,
                            pfs_gbs=args.pfs_gbs, link_gbs=args.link_gbs)
        sizes = sim.sample_sizes(args.samples, args.sample_bytes, args.size_sigma, args.seed)
        config.check(nodes, caches, sizes)
        uses = sim.total_uses(config, nodes, caches)
        if not args.quiet:
            note(f"prestage simulate: {uses:,} sample uses to walk ({len(nodes)} node counts x "
                 f"{len(caches)} cache sizes x {args.epochs} epochs of {args.samples:,} samples): "
                 f"about {_duration(uses / USES_PER_S)} at {USES_PER_S:,} uses/s (one core; measured "
                 f"end to end); --samples 20000 gives a first look in seconds")
        with progress(sim.total_uses(config, nodes, caches), desc="simulate", unit="use",
                      enabled=not args.quiet) as bar:
            study = sim.simulate(config, nodes, caches, sizes, on_uses=bar.update)
        study["sizes"] = {"distribution": "lognormal" if args.size_sigma > 0 else "uniform",
                          "mean_bytes": args.sample_bytes, "sigma": args.size_sigma}
        table = sim.format_table(study)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "simulate.json").write_text(json.dumps(study, indent=1) + "\n")
            (args.out / "simulate.md").write_text(table + "\n")
            sim.plot_study(study, args.out / "simulate.png")
    except KeyboardInterrupt:
        note("prestage simulate: interrupted")
        return 130
    except (ValueError, OSError) as e:
        note(f"prestage simulate: {e}")
        return 2
    print(table)
    return 0
