"""Stage 1, the plan: pure functions of (N, batch size, seed, epoch, rank, world size, ...).

``consumed_positions`` and ``batches_in_epoch`` are the arithmetic of a resume on another layout
(see :mod:`prestage.state`)."""

from prestage._core import batches_in_epoch, consumed_positions, epoch_batches, epoch_order

__all__ = ["batches_in_epoch", "consumed_positions", "epoch_batches", "epoch_order"]
