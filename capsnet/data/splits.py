"""Seeded, class-stratified train/validation splits and per-epoch orderings."""
from __future__ import annotations

import torch


def stratified_split(labels: torch.Tensor, val_size: int,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted, disjoint indices (train, val) covering (N,) labels, ``val_size`` of them
    spread over the classes by frequency; deterministic for a seed."""
    labels = labels.cpu()
    n = labels.numel()
    if not 0 <= val_size < n:
        raise ValueError(f"validation size {val_size} must be in [0, {n})")
    g = torch.Generator().manual_seed(seed)
    classes, counts = labels.unique(return_counts=True)
    # Largest-remainder apportionment of val_size over the classes.
    quotas = counts.double() * val_size / n
    take = quotas.floor().long()
    remainder = val_size - int(take.sum())
    take[torch.argsort(quotas - take, descending=True)[:remainder]] += 1
    val_parts = []
    for cls, k in zip(classes.tolist(), take.tolist(), strict=False):
        members = (labels == cls).nonzero().squeeze(1)
        val_parts.append(members[torch.randperm(members.numel(), generator=g)[:k]])
    val = torch.cat(val_parts).sort().values if val_parts else torch.empty(0, dtype=torch.long)
    is_val = torch.zeros(n, dtype=torch.bool)
    is_val[val] = True
    return (~is_val).nonzero().squeeze(1), val


def held_out(labels: torch.Tensor, fraction: float,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out) indices: a stratified ``fraction`` of labels (N,), at least one of
    each side."""
    n = labels.numel()
    return stratified_split(labels, min(max(1, round(fraction * n)), n - 1), seed)


def epoch_order(n: int, seed: int, epoch: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The shuffled order of ``n`` examples for one epoch, a function of (seed, epoch) only,
    so that a resumed run sees exactly the batches it would have seen."""
    g = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n, generator=g).to(device)


def epoch_seed(seed: int, epoch: int) -> int:
    """One 63-bit seed from a run seed and an epoch number."""
    return (seed * 1_000_003 + epoch * 7_919 + 12_345) % (2**63 - 1)
