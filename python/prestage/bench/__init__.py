"""The machinery behind ``prestage bench`` and ``prestage tune``.

- :mod:`prestage.bench.emulator`: mounts and unmounts ``prestage-pfs``, a slow "parallel file system"
  emulated with FUSE (latency per operation, bandwidth cap, concurrency cap);
- :mod:`prestage.bench.cache`: cold page caches between runs;
- :mod:`prestage.bench.modes`: one run of each mode of the paper (direct, stage-all, pipelined, ideal);
- :mod:`prestage.bench.baselines`: the PyTorch ``DataLoader`` and ``tf.data`` baselines, each run in a
  process of its own;
- :mod:`prestage.bench.grid`: the prefetchers x readers x lookahead grid (``prestage tune`` searches it);
- :mod:`prestage.bench.report`: the table, the ratios and the JSON; :mod:`prestage.bench.plots`: figures
  (matplotlib, imported only there).

Nothing here is imported by ``import prestage``.
"""
