"""The machinery behind ``prestage bench``, ``prestage tune`` and ``prestage simulate``.

- :mod:`prestage.bench.session`: what ``bench`` and ``tune`` share: their common options, and a session
  that mounts the emulated PFS (or not), builds the catalog and cleans up on the way out;
- :mod:`prestage.bench.emulator`: mounts and unmounts ``prestage-pfs``, a slow "parallel file system"
  emulated with FUSE (latency per operation, bandwidth cap, concurrency cap);
- :mod:`prestage.bench.cache`: cold page caches between runs;
- :mod:`prestage.bench.modes`: one run of each mode of the paper (direct, stage-all, pipelined, ideal);
- :mod:`prestage.bench.baselines`: the PyTorch ``DataLoader`` and ``tf.data`` baselines, each run in a
  process of its own;
- :mod:`prestage.bench.grid`: the prefetchers x readers x lookahead grid (``prestage tune`` searches it);
- :mod:`prestage.bench.cache_study`: a stage directory smaller than the set over several epochs, per
  eviction policy (``prestage bench --cache-bytes``), and the sizes ``--cache-bytes`` takes (``25%``,
  ``4G``; ``prestage pack``'s shard sizes too, less the percentages);
- :mod:`prestage.bench.simulate`: the peer tier on many nodes, simulated from the plan (``prestage
  simulate``);
- :mod:`prestage.bench.report`: the table, the ratios and the JSON; :mod:`prestage.bench.plots`: figures
  (matplotlib, imported only there).

Nothing here is imported by ``import prestage``.
"""
