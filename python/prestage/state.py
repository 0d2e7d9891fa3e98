"""Checkpointed positions: the global position of a state dict, and merging the ranks' states.

A loader's ``state_dict()`` holds a global position: the samples of the epoch's global permutation
consumed, independent of how they were split among ranks. In the usual case (every rank delivered
the same number of batches) it is one count, ``position``: the first ``position`` samples of the
epoch's order. A loader of any ``world_size``, ``batch_size`` and ``drop_last`` resumes from it
(``load_state_dict``): the rest of the epoch, split over its ranks, then whole epochs.

When the ranks stopped at different batches, merge their states first: :func:`merge_states` from the
dicts saved by each rank, or ``prestage.torch.gather_state`` in a DDP job. Samples consumed past the
common prefix are then listed in ``consumed_beyond`` (``[begin, end)`` ranges of positions).

The arithmetic is the C++ plan's (``prestage.plan.consumed_positions``); this module only reads
and writes the dicts.

>>> merged = prestage.state.merge_states([torch.load(f"ckpt/loader-{r}.pt") for r in range(8)])
>>> loader.load_state_dict(merged)
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from prestage import _core
from prestage.errors import ConfigError

__all__ = ["consumed_of", "make_state", "merge_states", "normalized"]

Ranges = List[Tuple[int, int]]

# The plan's parameters a state is taken with. seed, shuffle and num_samples must match the loader
# that resumes; the others may differ (a resume on another layout).
_LAYOUT = ("batch_size", "world_size", "drop_last")
_SAME = ("seed", "shuffle", "num_samples")


def _ranges(name: str, value: object) -> Ranges:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} must be a list of [begin, end] pairs, got {value!r}")
    out: Ranges = []
    for pair in value:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)):
            raise ConfigError(f"{name} must be a list of [begin, end] pairs, got {value!r}")
        out.append((int(pair[0]), int(pair[1])))
    return out


def make_state(epoch: int, batch: int, rank: int, consumed: Ranges, resumed_from: Ranges,
               plan: Dict[str, Any]) -> Dict[str, Any]:
    """The state dict of a loader of plan ``plan`` (seed, shuffle, batch_size, world_size, drop_last,
    num_samples) at batch ``batch`` of ``epoch``, whose global position is ``consumed``."""
    position = consumed[0][1] if consumed and consumed[0][0] == 0 else 0
    beyond = consumed[1:] if position else consumed
    state: Dict[str, Any] = {"epoch": epoch, "batch": batch, "position": position,
                             "consumed_beyond": [list(r) for r in beyond], "rank": rank,
                             "resumed_from": [list(r) for r in resumed_from]}
    state.update(plan)
    return state


def consumed_of(state: Dict[str, Any]) -> Ranges:
    """The positions of ``state["epoch"]``'s global order that ``state`` says were consumed, as
    sorted ``(begin, end)`` ranges. A state without a global position (taken before it existed)
    counts ``batch`` batches on every rank of the plan it names."""
    if "position" not in state:
        delivered = [_int(state, "batch")] * _int(state, "world_size")
        return _core.consumed_positions(_int(state, "num_samples"), _int(state, "batch_size"),
                                        _int(state, "world_size"), bool(state.get("drop_last")),
                                        delivered)
    position = _int(state, "position")
    beyond = _ranges("state_dict['consumed_beyond']", state.get("consumed_beyond", []))
    return ([(0, position)] if position else []) + beyond


def _int(state: Dict[str, Any], key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"state_dict[{key!r}] must be an integer >= 0, got {value!r}")
    return value


def merge_states(states: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One state from the states of every rank of a job (each rank's ``state_dict()``, saved apart):
    the samples any rank consumed, so a resume on any number of ranks gives each of the others
    exactly once, even when the ranks stopped at different batches.

    The states must be of one plan (the same seed, shuffle, catalog size, batch size and world size)
    and of every rank once (:class:`prestage.ConfigError` otherwise). Ranks an epoch ahead of the
    others count as at the end of the earliest epoch: what they took of the next one is taken again.
    """
    if not states:
        raise ConfigError("merge_states() needs the state of every rank, got none")
    first = states[0]
    plan = {key: first.get(key) for key in _SAME + _LAYOUT}
    world_size = _int(first, "world_size")
    by_rank: Dict[int, Dict[str, Any]] = {}
    for state in states:
        for key in _SAME + _LAYOUT:
            if state.get(key) != plan[key]:
                raise ConfigError(f"merge_states(): the states are of different plans: {key}="
                                  f"{state.get(key)!r} and {plan[key]!r}")
        rank = _int(state, "rank")
        if rank >= world_size or rank in by_rank:
            raise ConfigError(f"merge_states(): rank {rank} is not one of {world_size} ranks given once")
        by_rank[rank] = state
    if len(by_rank) != world_size:
        missing = sorted(set(range(world_size)) - set(by_rank))
        raise ConfigError(f"merge_states(): the states of ranks {missing} are missing")
    epoch = min(_int(s, "epoch") for s in states)
    at_epoch = [s for s in states if s["epoch"] == epoch]
    resumed_from = _ranges("state_dict['resumed_from']", at_epoch[0].get("resumed_from", []))
    n, batch_size, drop_last = _int(first, "num_samples"), _int(first, "batch_size"), bool(first["drop_last"])
    batches = _core.batches_in_epoch(n, batch_size, world_size, drop_last, resumed_from)
    delivered: List[int] = []
    for rank in range(world_size):
        state = by_rank[rank]
        if state["epoch"] != epoch:
            delivered.append(batches)
            continue
        if _ranges("state_dict['resumed_from']", state.get("resumed_from", [])) != resumed_from:
            raise ConfigError("merge_states(): the ranks resumed epoch "
                              f"{epoch} from different positions")
        delivered.append(_int(state, "batch"))
    consumed = _core.consumed_positions(n, batch_size, world_size, drop_last, delivered, resumed_from)
    merged = make_state(epoch, min(delivered), 0, consumed, resumed_from, plan)
    del merged["rank"]  # of all ranks
    return normalized(merged)


def normalized(state: Dict[str, Any]) -> Dict[str, Any]:
    """``state`` itself, or when every sample of its epoch was consumed, the start of the next."""
    consumed = consumed_of(state)
    if sum(e - b for b, e in consumed) < _int(state, "num_samples"):
        return state
    state = dict(state)
    state.update(epoch=state["epoch"] + 1, batch=0, position=0, consumed_beyond=[], resumed_from=[])
    return state

