"""cadence.kernels: each fused operator against an independent reference. Its torch twin (what the
CPU runs) and its Triton kernel (run here in Triton's interpreter, on CUDA by `make gpu-check`) must
both give autograd's loss and gradients of the plain formula; the operator's backward scales them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence import kernels
from tests.conftest import needs_cuda

CASES = [(softmax, sides, columns) for softmax in (False, True) for sides in (1, 2) for columns in (7, 300)]


def reference(scores: torch.Tensor, positive: torch.Tensor, softmax: bool):
    """Autograd's loss and gradients of the formula as first written (models/kge.py before the operator)."""
    scores, positive = scores.detach().double().requires_grad_(), positive.detach().double().requires_grad_()
    if softmax:
        sides = scores.shape[0] // positive.shape[0]
        logits = torch.cat([positive.repeat(sides).unsqueeze(1), scores], 1)
        loss = F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))
    else:
        loss = F.softplus(scores).mean() + F.softplus(-positive).mean()
    loss.backward()
    return loss.detach(), scores.grad, positive.grad


def sample(sides: int, columns: int, device: str = "cpu"):
    generator = torch.Generator().manual_seed(sides * 1000 + columns)
    scores = (torch.randn(sides * 9, columns, generator=generator) * 4).to(device)
    return scores, (torch.randn(9, generator=generator) * 4).to(device)


def assert_matches(got, expected) -> None:
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine.double().cpu(), theirs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("softmax, sides, columns", CASES)
def test_the_twin_is_autograds_loss_and_gradients(softmax: bool, sides: int, columns: int) -> None:
    scores, positive = sample(sides, columns)
    assert_matches(kernels.negative_loss_twin(scores, positive, softmax), reference(scores, positive, softmax))


@pytest.mark.skipif(not kernels.INTERPRETED, reason="Triton's interpreter (tests/conftest.py) is not on here")
@pytest.mark.parametrize("softmax, sides, columns", CASES)
def test_the_kernel_in_tritons_interpreter_is_autograds_loss_and_gradients(softmax: bool, sides: int, columns: int) -> None:
    """300 columns: more than a softmax program reads at once (two passes of 256); 7: a masked tail."""
    scores, positive = sample(sides, columns)
    assert_matches(kernels.negative_loss_kernel(scores, positive, softmax), reference(scores, positive, softmax))


@needs_cuda
@pytest.mark.parametrize("softmax, sides, columns", CASES)
def test_the_kernel_on_cuda_is_autograds_loss_and_gradients(softmax: bool, sides: int, columns: int) -> None:
    scores, positive = sample(sides, columns, "cuda")
    assert kernels.usable(scores) or not kernels.AVAILABLE
    assert_matches(kernels.negative_loss_kernel(scores, positive, softmax), reference(scores.cpu(), positive.cpu(), softmax))


@pytest.mark.parametrize("softmax", [False, True])
def test_the_operator_is_one_dispatch_and_its_backward_scales_the_gradients(softmax: bool) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        names: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    scores, positive = sample(2, 7)
    scores.requires_grad_(), positive.requires_grad_()
    with Count() as counter:
        loss = kernels.negative_loss(scores, positive, softmax)
    assert counter.names.count("cadence.negative_loss") == 1 and "aten.softplus" not in counter.names
    (loss * 3).backward()
    expected = reference(scores, positive, softmax)
    torch.testing.assert_close(loss.detach().double(), expected[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(scores.grad.double(), 3 * expected[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(positive.grad.double(), 3 * expected[2], rtol=1e-5, atol=1e-7)


def test_training_on_the_cpu_never_takes_the_interpreter() -> None:
    scores, _ = sample(1, 7)
    assert not kernels.usable(scores)


def naive_adagrad(values, state, grad, lr: float, eps: float, rowwise: bool):
    """Adagrad's definition, one row at a time, in float64."""
    values, state, grad = values.double().clone(), state.double().clone(), grad.double()
    for row in range(values.shape[0]):
        g = grad[row]
        state[row] += (g * g).mean() if rowwise else g * g
        values[row] -= lr * g / (state[row].sqrt() + eps)
    return values, state


def adagrad_sample(rowwise: bool, width: int, device: str = "cpu"):
    generator = torch.Generator().manual_seed(width + rowwise)
    values = torch.randn(11, width, generator=generator).to(device)
    state = torch.rand(11, 1 if rowwise else width, generator=generator).to(device)
    return values, state, torch.randn(11, width, generator=generator).to(device)


ADAGRAD = [(rowwise, width) for rowwise in (True, False) for width in (5, 300)]


INTERPRETER = pytest.mark.skipif(not kernels.INTERPRETED, reason="Triton's interpreter (tests/conftest.py) is not on here")


@pytest.mark.parametrize("step", [pytest.param(lambda *args: kernels.adagrad_rows(*args), id="operator"),
                                  pytest.param(lambda *args: kernels.adagrad_rows_kernel(*args), id="interpreted-kernel",
                                               marks=INTERPRETER)])
@pytest.mark.parametrize("rowwise, width", ADAGRAD)
def test_the_adagrad_step_is_the_definition(step, rowwise: bool, width: int) -> None:
    """The operator (its twin on the CPU) and the kernel in Triton's interpreter; 300: a row wider than
    a program reads at once."""
    values, state, grad = adagrad_sample(rowwise, width)
    expected = naive_adagrad(values, state, grad, 0.1, 1e-10, rowwise)
    step(values, state, grad, 0.1, 1e-10, rowwise)
    torch.testing.assert_close(values.double(), expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.double(), expected[1], rtol=1e-5, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize("rowwise, width", ADAGRAD)
def test_the_adagrad_kernel_on_cuda_steps_rows_as_the_definition(rowwise: bool, width: int) -> None:
    values, state, grad = adagrad_sample(rowwise, width, "cuda")
    expected = naive_adagrad(values.cpu(), state.cpu(), grad.cpu(), 0.1, 1e-10, rowwise)
    kernels.adagrad_rows(values, state, grad, 0.1, 1e-10, rowwise)
    torch.testing.assert_close(values.double().cpu(), expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.double().cpu(), expected[1], rtol=1e-5, atol=1e-6)


def test_cadence_kernels_0_turns_every_kernel_off() -> None:
    import subprocess
    import sys

    probe = "from cadence import kernels; print(kernels.ENABLED)"
    outputs = [subprocess.run([sys.executable, "-c", probe], env={**__import__("os").environ, "CADENCE_KERNELS": value},
                              capture_output=True, text=True, check=True).stdout.strip() for value in ("0", "1")]
    assert outputs == ["False", "True"]


BILINEAR = [(name, both) for name in ("distmult", "complex") for both in (True, False)]


def scorer_reference(name: str, h, r, t, pool, both: bool):
    """The scorer's own forms (cadence.models.scorers: score_sides / score_tails and score), whose
    autograd gradients the operator must give."""
    from cadence.config import ModelConfig
    from cadence.models.scorers import SCORERS

    scorer = SCORERS.get(name)(ModelConfig(name=name, dim=h.shape[1]))
    scores = scorer.score_sides(h, r, t, pool) if both else scorer.score_tails(h, r, pool)
    return scores, scorer.score(h, r, t)


def bilinear_sample(device: str = "cpu", width: int = 70):
    generator = torch.Generator().manual_seed(7)
    # 37 edges, 45 candidates, width 70: none a multiple of a tile (32), ComplEx's 35 halves neither
    return [torch.randn(n, width, generator=generator).to(device) for n in (37, 37, 37, 45)]


def check_bilinear(name: str, both: bool, forward, backward, device: str = "cpu", width: int = 70) -> None:
    h, r, t, pool = bilinear_sample(device, width)
    leaves = [x.detach().double().cpu().requires_grad_() for x in (h, r, t, pool)]
    scores, positive = scorer_reference(name, *leaves, both)
    generator = torch.Generator().manual_seed(8)
    d_scores, d_positive = torch.randn(scores.shape, generator=generator), torch.randn(positive.shape, generator=generator)
    ((scores * d_scores).sum() + (positive * d_positive).sum()).backward()
    complex_ = name == "complex"
    got = forward(h, r, t, pool, complex_, both)
    for mine, theirs in zip(got, (scores, positive)):
        torch.testing.assert_close(mine.double().cpu(), theirs.detach(), rtol=1e-4, atol=1e-4)
    grads = backward(d_scores.float().to(device), d_positive.float().to(device), h, r, t, pool, complex_, both)
    for mine, leaf in zip(grads, leaves):
        torch.testing.assert_close(mine.double().cpu(), leaf.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("width", [70, 8])  # 8: the narrow products the twin computes transposed
@pytest.mark.parametrize("name, both", BILINEAR)
def test_the_bilinear_twin_is_the_scorers_scores_and_autograds_gradients(name: str, both: bool, width: int) -> None:
    check_bilinear(name, both, kernels.bilinear_scores_twin, kernels.bilinear_scores_backward_twin, width=width)


@pytest.mark.skipif(not kernels.INTERPRETED, reason="Triton's interpreter (tests/conftest.py) is not on here")
@pytest.mark.parametrize("name, both", BILINEAR)
def test_the_bilinear_kernels_in_tritons_interpreter_are_the_scorers_scores_and_gradients(name: str, both: bool) -> None:
    check_bilinear(name, both, kernels.bilinear_scores_kernel, kernels.bilinear_scores_backward_kernel)


@needs_cuda
@pytest.mark.parametrize("name, both", BILINEAR)
def test_the_bilinear_kernels_on_cuda_are_the_scorers_scores_and_gradients(name: str, both: bool) -> None:
    check_bilinear(name, both, kernels.bilinear_scores_kernel, kernels.bilinear_scores_backward_kernel, "cuda")


def test_the_dense_adagrad_operator_is_torchs_step_bit_for_bit() -> None:
    param = torch.nn.Parameter(torch.randn(4, 3))
    twin = torch.nn.Parameter(param.detach().clone())
    optimizer = torch.optim.Adagrad([twin], lr=0.2, eps=1e-8)
    for seed in range(3):
        grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
        twin.grad = grad.clone()
        optimizer.step()
        if seed == 0:
            state = {"sum": torch.zeros(4, 3), "step": torch.tensor(0.0)}
        kernels.adagrad_dense(param.data, state["sum"], state["step"], grad, 0.2, 1e-8)
    assert torch.equal(param, twin) and torch.equal(state["sum"], optimizer.state[twin]["sum"])
    assert float(state["step"]) == float(optimizer.state[twin]["step"]) == 3


DENSE_SHAPES = [(4, 3), (5,), (), (2, 3, 2, 2)]


def dense_adagrad_case(shape, device: str = "cpu"):
    """A parameter of ``shape`` stepped three times by ``torch.optim.Adagrad`` (the reference) and
    the gradients it took."""
    generator = torch.Generator().manual_seed(len(shape))
    param = torch.randn(shape, generator=generator)
    grads = [torch.randn(shape, generator=generator) for _ in range(3)]
    twin = torch.nn.Parameter(param.clone())
    optimizer = torch.optim.Adagrad([twin], lr=0.2, eps=1e-8)
    for grad in grads:
        twin.grad = grad.clone()
        optimizer.step()
    return param.to(device), [grad.to(device) for grad in grads], twin.detach(), optimizer.state[twin]["sum"]


@INTERPRETER
@pytest.mark.parametrize("shape", DENSE_SHAPES, ids=str)
def test_the_adagrad_kernel_in_tritons_interpreter_steps_a_dense_parameter_of_any_shape(shape) -> None:
    """A bias (1-D), a scalar, a conv weight (4-D): the element-wise kernel takes them as rows (a
    GPU run found 1-D biases refused)."""
    param, grads, expected, expected_sum = dense_adagrad_case(shape)
    total = torch.zeros_like(param)
    for grad in grads:
        kernels.adagrad_rows_kernel(param, total, grad, 0.2, 1e-8, False)
    torch.testing.assert_close(param, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total, expected_sum, rtol=1e-5, atol=1e-6)


@needs_cuda
@pytest.mark.parametrize("shape", DENSE_SHAPES, ids=str)
def test_the_dense_adagrad_operator_on_cuda_steps_a_parameter_of_any_shape(shape) -> None:
    param, grads, expected, expected_sum = dense_adagrad_case(shape, "cuda")
    total, steps = torch.zeros_like(param), torch.tensor(0.0)
    for grad in grads:
        kernels.adagrad_dense(param, total, steps, grad, 0.2, 1e-8)
    torch.testing.assert_close(param.cpu(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total.cpu(), expected_sum, rtol=1e-5, atol=1e-6)
    assert float(steps) == 3
