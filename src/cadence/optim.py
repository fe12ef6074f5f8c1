"""Optimizers for entity rows whose state lives in the ``EmbeddingStore`` next to the rows.

Sparse rows cannot use ``torch.optim`` (its state is keyed by parameter, not by row), so the state is
a store column: one float per row for row-wise Adagrad (PyTorch-BigGraph's choice: dim times less
memory than element-wise, with nearly the same quality), ``dim`` floats for element-wise Adagrad.
An update reads and writes only the batch's rows; rows absent from a batch are untouched.
"""

from __future__ import annotations

import copy

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from cadence import kernels
from cadence.config import OptimizerConfig
from cadence.registry import Registry

ENTITY_OPTIMIZERS: Registry[type["EntityOptimizer"]] = Registry("entity optimizer", "optimizer.entity")


def row_gradient(rows: Tensor) -> Tensor:
    """The gradient of a batch's rows after its backward pass; zeros when the loss used none of
    them (a dense-only task's), so every runtime steps and pushes rows the same way."""
    return rows.grad if rows.grad is not None else torch.zeros_like(rows)


class EntityOptimizer(ABC):
    reads: tuple[str, ...] = ()  # the optimizer keys this rule reads beyond the rate

    def __init__(self, config: OptimizerConfig):
        self.lr = config.lr
        self.eps = config.eps

    @staticmethod
    @abstractmethod
    def state_width(dim: int) -> int: ...

    @abstractmethod
    def step(self, values: Tensor, state: Tensor, grad: Tensor) -> None:
        """Update ``values`` [n, D] and ``state`` [n, S] in place from ``grad`` [n, D]."""

    def row_step(self) -> kernels.RowStep | None:
        """This rule as a fused training step applies it (``kge_step.kge_step``), or None where no
        fused step does (the step then goes through autograd and ``step``)."""
        return None


@ENTITY_OPTIMIZERS.register("rowwise_adagrad")
class RowwiseAdagrad(EntityOptimizer):
    reads = ("optimizer.eps",)

    @staticmethod
    def state_width(dim: int) -> int:
        return 1

    def step(self, values, state, grad):  # one operator (cadence.kernels): one kernel on a GPU
        kernels.adagrad_rows(values, state, grad, self.lr, self.eps, rowwise=True)

    def row_step(self):
        return kernels.RowStep(self.lr, self.eps, rowwise=True)


@ENTITY_OPTIMIZERS.register("adagrad")
class ElementwiseAdagrad(EntityOptimizer):
    reads = ("optimizer.eps",)

    @staticmethod
    def state_width(dim: int) -> int:
        return dim

    def step(self, values, state, grad):
        kernels.adagrad_rows(values, state, grad, self.lr, self.eps, rowwise=False)

    def row_step(self):
        return kernels.RowStep(self.lr, self.eps, rowwise=False)


@ENTITY_OPTIMIZERS.register("sgd")
class Sgd(EntityOptimizer):
    """Plain SGD, no state (word2vec's update; its learning-rate decay is the task's business)."""

    @staticmethod
    def state_width(dim: int) -> int:
        return 0

    def step(self, values, state, grad):
        values.add_(grad, alpha=-self.lr)


# the optimizer keys each dense rule reads beyond the rate, the decay and the schedule
DENSE_READS: dict[str, tuple[str, ...]] = {"adagrad": ("optimizer.eps",), "adam": (),
                                           "sgd": ("optimizer.momentum", "optimizer.nesterov")}


def schedule_reads(config: OptimizerConfig) -> tuple[str, ...]:
    """The schedule keys this config's schedule reads: ``warmup_lr`` only with warm-up epochs."""
    return ("optimizer.warmup_lr",) if config.warmup_epochs else ()


def dense_optimizer(config: OptimizerConfig, parameters: list) -> torch.optim.Optimizer:
    lr = config.dense_lr if config.dense_lr is not None else config.lr
    decay = config.weight_decay
    if config.dense == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=decay)
    if config.dense == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=config.momentum, weight_decay=decay,
                               nesterov=config.nesterov)
    return torch.optim.Adagrad(parameters, lr=lr, eps=config.eps, weight_decay=decay)


FROZEN = "frozen_parameters"  # the attribute of a module naming its parameters that do not train


def freeze_parameters(module: nn.Module, names: list[str]) -> None:
    """Mark parameters of ``module`` as frozen: every optimizer made for it (``module_optimizer``)
    steps them at rate 0, which leaves a parameter as it is under every ``torch.optim`` rule, weight
    decay and momentum included. The mark is an attribute: copies and pickles of the module keep it."""
    setattr(module, FROZEN, frozenset(names))


def module_optimizer(config: OptimizerConfig, module: nn.Module,
                     state: dict | None = None) -> torch.optim.Optimizer | None:
    """The dense optimizer of ``module``'s parameters (None when it has none), continuing from
    ``state`` (another copy's ``state_dict()``) when given: the one way every runtime, shard, worker
    replica and node makes one. A module with frozen parameters gets one group per parameter (in
    ``parameters()`` order, so the state's numbering is unchanged), a frozen one's rate 0 for good
    (``set_lr`` skips it)."""
    named = list(module.named_parameters())
    if not named:
        return None
    frozen = getattr(module, FROZEN, frozenset())
    parameters: list = [param for _, param in named]
    if frozen:
        parameters = [{"params": [param], "frozen": name in frozen, **({"lr": 0.0} if name in frozen else {})}
                      for name, param in named]
    optimizer = dense_optimizer(config, parameters)
    if state is not None:
        optimizer.load_state_dict(copy.deepcopy(state))
    return optimizer


def dense_lr(config: OptimizerConfig, epochs: int, epoch: int) -> float:
    """The dense learning rate of ``epoch`` (0-based) in a run of ``epochs`` epochs.

    ``schedule: constant``: the base rate (``dense_lr``, else ``lr``) throughout. ``cosine``: the
    first ``warmup_epochs`` at ``warmup_lr`` (pdASGD's protocol: 5 epochs at 0.005), then the base
    rate annealed along half a cosine to 0 over the remaining epochs, once per epoch (as
    ``torch.optim.lr_scheduler.CosineAnnealingLR`` stepped per epoch with ``T_max`` = those epochs).
    A function of the epoch alone, so every runtime and every replica sets the same rate."""
    base = config.dense_lr if config.dense_lr is not None else config.lr
    warmup = config.warmup_epochs
    if epoch < warmup:
        return config.warmup_lr if config.warmup_lr is not None else base
    if config.schedule == "constant":
        return base
    span = max(1, epochs - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(epoch - warmup, span) / span))


def set_lr(optimizer: torch.optim.Optimizer | None, lr: float) -> None:
    """Set the dense rate of every group but a frozen parameter's (``freeze_parameters``)."""
    if optimizer is not None:
        for group in optimizer.param_groups:
            if not group.get("frozen"):
                group["lr"] = lr


class InPlaceDense:
    """The dense optimizer's rule applied to one parameter at a time, in place, with no lock: what a
    Hogwild thread (ShadowSync's trainers) or a pdASGD backward thread does with its own gradients,
    never through the shared ``.grad`` fields (other threads' gradients live there).

    Updates go through ``.data``: a graph in flight elsewhere that saved the parameter sees the new
    values and is not failed by autograd's version check (the bargain of Hogwild and pdASGD). The
    state lives in ``optimizer`` (a ``torch.optim`` object, never stepped), so checkpoints store it
    as any dense optimizer's; the rate is read from the parameter's group at each step (the schedule
    sets it). One thread stepping every parameter once per batch computes exactly ``optimizer.step()``
    (Adagrad, Adam, SGD with momentum, weight decay, Nesterov; tested bit for bit), with fewer
    operators (none of ``step()``'s profiler marks, no host read of Adagrad's step count): the
    pipeline's compute stage steps its dense parameters with it too. The state is looked up at each
    step, so a ``load_state_dict`` of the optimizer (a resumed run) is seen."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[Tensor]):
        self.optimizer, self.params = optimizer, params
        group_of = {id(param): group for group in optimizer.param_groups for param in group["params"]}
        self.groups = [group_of[id(param)] for param in params]  # (one group, or one per parameter)
        self.kind = ("adam" if isinstance(optimizer, torch.optim.Adam)
                     else "sgd" if isinstance(optimizer, torch.optim.SGD) else "adagrad")
        self.views: list[Tensor | None] = [None] * len(params)  # each parameter's ``.data``, kept
        for param in params:
            self._state(param)

    def _state(self, param: Tensor) -> dict:
        """The optimizer's state of ``param`` (Adam's made as its first step would: we never call step)."""
        state = self.optimizer.state[param]
        if self.kind == "adam" and not state:
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
        return state

    def _data(self, index: int) -> Tensor:
        """Parameter ``index``'s ``.data`` (an operator each time it is taken): kept, and taken again
        when the parameter's storage changed (moved to a device, resized)."""
        view, param = self.views[index], self.params[index]
        if view is None or view.data_ptr() != param.data_ptr() or view.shape != param.shape:
            view = self.views[index] = param.data
        return view

    def step(self, grads: list[Tensor | None]) -> None:
        """Step parameter i from ``grads[i]`` (None: the loss did not use it; left as it is)."""
        for index, grad in enumerate(grads):
            if grad is not None:
                self.step_one(index, grad)

    def step_gradients(self) -> None:
        """Step every parameter that has a gradient (its ``.grad``, as ``optimizer.step()`` reads
        them), then drop the gradients (``zero_grad(set_to_none=True)``)."""
        for index, param in enumerate(self.params):
            if param.grad is not None:
                self.step_one(index, param.grad)
                param.grad = None

    @torch.no_grad()
    def step_one(self, index: int, grad: Tensor) -> None:
        """Update parameter ``index`` from ``grad``, as ``torch.optim`` (single-tensor) computes it."""
        group, param = self.groups[index], self.params[index]
        state, param = self._state(param), self._data(index)
        lr, decay = group["lr"], group["weight_decay"]
        if decay:
            grad = grad.add(param, alpha=decay)
        if self.kind == "sgd":
            momentum = group["momentum"]
            if momentum:
                buffer = state.get("momentum_buffer")
                if buffer is None:
                    buffer = state["momentum_buffer"] = torch.clone(grad).detach()
                else:
                    buffer.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
                grad = grad.add(buffer, alpha=momentum) if group["nesterov"] else buffer
            param.add_(grad, alpha=-lr)
            return
        if self.kind == "adagrad":  # (one operator: the step count, the sum and the update)
            kernels.adagrad_dense(param, state["sum"], state["step"], grad, lr, group["eps"])
            return
        state["step"] += 1
        step, (beta1, beta2) = float(state["step"]), group["betas"]
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        correction2 = (1 - beta2 ** step) ** 0.5
        denom = (state["exp_avg_sq"].sqrt() / correction2).add_(group["eps"])
        param.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** step))
