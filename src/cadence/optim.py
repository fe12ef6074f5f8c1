"""Optimizers for entity rows whose state lives in the ``EmbeddingStore`` next to the rows.

Sparse rows cannot use ``torch.optim`` (its state is keyed by parameter, not by row), so the state is
a store column: one float per row for row-wise Adagrad (PyTorch-BigGraph's choice: dim times less
memory than element-wise, with nearly the same quality), ``dim`` floats for element-wise Adagrad.
An update reads and writes only the batch's rows; rows absent from a batch are untouched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from cadence.config import OptimizerConfig
from cadence.registry import Registry

ENTITY_OPTIMIZERS: Registry[type["EntityOptimizer"]] = Registry("entity optimizer", "optimizer.entity")


class EntityOptimizer(ABC):
    def __init__(self, config: OptimizerConfig):
        self.lr = config.lr
        self.eps = config.eps

    @staticmethod
    @abstractmethod
    def state_width(dim: int) -> int: ...

    @abstractmethod
    def step(self, values: Tensor, state: Tensor, grad: Tensor) -> None:
        """Update ``values`` [n, D] and ``state`` [n, S] in place from ``grad`` [n, D]."""


@ENTITY_OPTIMIZERS.register("rowwise_adagrad")
class RowwiseAdagrad(EntityOptimizer):
    @staticmethod
    def state_width(dim: int) -> int:
        return 1

    def step(self, values, state, grad):
        state.add_(grad.square().mean(dim=1, keepdim=True))
        values.addcdiv_(grad, state.sqrt().add_(self.eps), value=-self.lr)


@ENTITY_OPTIMIZERS.register("adagrad")
class ElementwiseAdagrad(EntityOptimizer):
    @staticmethod
    def state_width(dim: int) -> int:
        return dim

    def step(self, values, state, grad):
        state.addcmul_(grad, grad)
        values.addcdiv_(grad, state.sqrt().add_(self.eps), value=-self.lr)


@ENTITY_OPTIMIZERS.register("sgd")
class Sgd(EntityOptimizer):
    """Plain SGD, no state (word2vec's update; its learning-rate decay is the task's business)."""

    @staticmethod
    def state_width(dim: int) -> int:
        return 0

    def step(self, values, state, grad):
        values.add_(grad, alpha=-self.lr)


def dense_optimizer(config: OptimizerConfig, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
    lr = config.dense_lr if config.dense_lr is not None else config.lr
    if config.dense == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    return torch.optim.Adagrad(parameters, lr=lr, eps=config.eps)
