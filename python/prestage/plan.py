"""Stage 1, the plan: pure functions of (N, batch size, seed, epoch, rank, world size, ...)."""

from prestage._core import epoch_batches, epoch_order

__all__ = ["epoch_batches", "epoch_order"]
