"""The running top-k of blocks against one stable sort of every score."""

from __future__ import annotations

import pytest
import torch

from cadence.prediction.top import RunningTopK, block_rows, id_blocks


def every_score_sorted(scores: torch.Tensor, k: int) -> list[int]:
    """The reference: the ids of the k best of all scores, ties in id order, left-out ones never."""
    pairs = sorted(((-float(s), i) for i, s in enumerate(scores.tolist()) if s > float("-inf")))
    return [i for _, i in pairs[:k]]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 50, 1000])
@pytest.mark.parametrize("k", [1, 4, 10, 60])
def test_blocks_merged_equal_one_sort_of_every_score(block: int, k: int) -> None:
    generator = torch.Generator().manual_seed(block * 100 + k)
    scores = torch.randint(0, 6, (50,), generator=generator).float()  # many ties
    scores[torch.randperm(50, generator=generator)[:9]] = float("-inf")  # left out
    scores[3] = float("nan")
    best = RunningTopK(k)
    for ids in id_blocks(50, block):
        best.add(scores[ids], ids)
    assert best.ids.tolist() == every_score_sorted(scores, k)
    assert best.scores.tolist() == [float(scores[i]) for i in best.ids]


def test_blocks_cover_every_id_once_in_order() -> None:
    assert torch.cat(list(id_blocks(10, 3))).tolist() == list(range(10))
    assert [len(ids) for ids in id_blocks(10, 3)] == [3, 3, 3, 1]
    assert block_rows(1 << 30) == 1 and block_rows(4) == (1 << 22) // 4
