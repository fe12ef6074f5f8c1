"""cadence.kernels: each fused operator against an independent reference. Its torch twin (what the
CPU runs) and its Triton kernel (run here in Triton's interpreter, on CUDA by `make gpu-check`) must
both give autograd's loss and gradients of the plain formula; the operator's backward scales them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cadence import kernels, kge_step
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
    assert_matches(kernels.negative_loss_kernel(scores, positive, softmax), reference(scores, positive, softmax))


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


@pytest.mark.parametrize("name, both", BILINEAR)
def test_the_bilinear_operator_differentiates_as_the_scorer(name: str, both: bool) -> None:
    """Through autograd: the operator's registered backward gives the scorer's gradients."""
    h, r, t, pool = (x.requires_grad_() for x in bilinear_sample())
    scores, positive = kernels.bilinear_scores(h, r, t, pool, name == "complex", both)
    (scores.square().sum() + positive.sum()).backward()
    leaves = [x.detach().double().requires_grad_() for x in (h, r, t, pool)]
    ref_scores, ref_positive = scorer_reference(name, *leaves, both)
    (ref_scores.square().sum() + ref_positive.sum()).backward()
    for mine, leaf in zip((h, r, t, pool), leaves):
        torch.testing.assert_close(mine.grad.double(), leaf.grad, rtol=1e-4, atol=1e-3)


def test_the_bilinear_operator_differentiates_through_either_output_alone() -> None:
    for pick in (0, 1):
        h, r, t, pool = (x.requires_grad_() for x in bilinear_sample())
        kernels.bilinear_scores(h, r, t, pool, False, True)[pick].sum().backward()
        leaves = [x.detach().double().requires_grad_() for x in (h, r, t, pool)]
        scorer_reference("distmult", *leaves, True)[pick].sum().backward()
        for mine, leaf in zip((h, r, t, pool), leaves):  # (the positives do not read the pool)
            expected = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            torch.testing.assert_close(mine.grad.double(), expected, rtol=1e-4, atol=1e-3)


# ---- bilinear_step: the whole step against autograd's path --------------------------------------
STEP_CASES = [(name, reciprocal, loss, optimizer) for name in ("distmult", "complex") for reciprocal in (False, True)
              for loss in ("logistic", "softmax") for optimizer in ("rowwise_adagrad", "adagrad")]


def step_setting(name: str, reciprocal: bool, loss: str, optimizer: str, *more: str):
    """A KGE model, a batch's rows (21 unique of 40, ids repeating among heads, tails and candidates,
    width 6, ComplEx's 3 halves), its positions and relations, and the row rule."""
    from cadence.config import load_config
    from cadence.models.kge import KgeModel
    from cadence.optim import ENTITY_OPTIMIZERS

    config = load_config(None, [f"model.name={name}", "model.dim=6", "train.negatives=9", f"train.loss={loss}",
                                f"train.reciprocal={str(reciprocal).lower()}", f"optimizer.entity={optimizer}",
                                "optimizer.lr=0.3", *more])
    model = KgeModel(config, 5)
    rule = ENTITY_OPTIMIZERS.get(optimizer)(config.optimizer)
    generator = torch.Generator().manual_seed(3)
    values = torch.randn(21, 6, generator=generator)
    state = torch.rand(21, rule.state_width(6), generator=generator)
    positions = torch.randint(0, 21, (2 * 8 + 9,), generator=generator)
    return model, rule, values, state, positions, torch.randint(0, 5, (8,), generator=generator)


def autograd_step(model, rule, values, state, positions, relations):
    """The reference: autograd through ``loss_at``, then the row rule's own step; the relations'
    gradient as autograd leaves it."""
    rows = values.clone().requires_grad_()
    loss = model.loss_at(rows, positions, relations)
    loss.backward()
    values, state = values.clone(), state.clone()
    with torch.no_grad():
        rule.step(values, state, rows.grad)
    return loss.detach(), values, state, model.relations.grad.clone()


@pytest.mark.parametrize("name, reciprocal, loss, optimizer", STEP_CASES)
def test_the_fused_step_is_autograds_step_bit_for_bit(name: str, reciprocal: bool, loss: str, optimizer: str) -> None:
    model, rule, values, state, positions, relations = step_setting(name, reciprocal, loss, optimizer)
    expected = autograd_step(model, rule, values, state, positions, relations)
    fused = model.fused_step(values, state, positions, relations, rule.row_step())
    assert fused is not None, "DistMult and ComplEx with shared negatives take the fused step"
    got_loss, (d_relations,) = fused
    for mine, theirs in zip((got_loss, values, state, d_relations), expected):
        assert torch.equal(mine, theirs)


@pytest.mark.skipif(not kernels.INTERPRETED, reason="Triton's interpreter (tests/conftest.py) is not on here")
@pytest.mark.parametrize("name, reciprocal, loss", [(n, r, l) for n, r, l, o in STEP_CASES if o == "rowwise_adagrad"])
def test_the_fused_steps_kernels_in_tritons_interpreter_are_autograds_step(name: str, reciprocal: bool, loss: str) -> None:
    model, rule, values, state, positions, relations = step_setting(name, reciprocal, loss, "rowwise_adagrad")
    expected = autograd_step(model, rule, values, state, positions, relations)
    step = rule.row_step()
    got_loss, d_relations = kge_step.bilinear_step_parts(
        values, state, positions, model.relations.detach(), relations, name == "complex", not reciprocal,
        loss == "softmax", step.lr, step.eps, step.rowwise, kernel=True)
    for mine, theirs in zip((got_loss, values, state, d_relations), expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("name, reciprocal, loss", [(n, r, l) for n, r, l, o in STEP_CASES if o == "rowwise_adagrad"])
def test_the_fused_step_on_cuda_is_autograds_step(name: str, reciprocal: bool, loss: str) -> None:
    model, rule, values, state, positions, relations = step_setting(name, reciprocal, loss, "rowwise_adagrad")
    expected = autograd_step(model, rule, values, state, positions, relations)
    cuda = [x.cuda() for x in (values, state, positions, relations)]
    model.cuda()
    got_loss, (d_relations,) = model.fused_step(*cuda[:2], cuda[2], cuda[3], rule.row_step())
    for mine, theirs in zip((got_loss, cuda[0], cuda[1], d_relations), expected):
        torch.testing.assert_close(mine.cpu(), theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("more", [("model.name=transe",), ("train.regularizer=n3", "train.reg_weight=0.01")],
                         ids=["a scorer without the operator", "a regulariser"])
def test_what_the_fused_step_does_not_compute_takes_autograds_path(more) -> None:
    model, rule, values, state, positions, relations = step_setting("distmult", False, "logistic",
                                                                     "rowwise_adagrad", *more)
    assert model.fused_step(values, state, positions, relations, rule.row_step()) is None


def test_a_chunked_pool_takes_autograds_path() -> None:
    model, rule, values, state, positions, relations = step_setting("distmult", False, "logistic", "rowwise_adagrad")
    two_chunks = torch.cat([positions, positions[-9:]])  # 2 x 9 candidates: two chunks of edges
    assert model.fused_step(values, state, two_chunks, relations, rule.row_step()) is None


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


def test_the_fused_steps_operator_has_its_outputs_shapes_for_tracing() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, rule, values, state, positions, relations = step_setting("distmult", False, "logistic", "rowwise_adagrad")
    with FakeTensorMode(allow_non_fake_inputs=True):
        loss, d_relations = torch.ops.cadence.bilinear_step(values, state, positions, model.relations.detach(),
                                                            relations, False, True, False, 0.1, 1e-10, True)
    assert loss.shape == () and d_relations.shape == model.relations.shape


@needs_cuda
def test_the_fused_step_on_cuda_gives_the_same_bits_every_run() -> None:
    """OAC's bit-identity to its sync replay on a GPU needs a deterministic step: many edges sharing a
    few rows, whose gradients CUDA's atomic adds would sum in any order."""
    model, rule, values, state, _, relations = step_setting("complex", False, "softmax", "rowwise_adagrad")
    positions = torch.randint(0, 3, (2 * 8 + 9,), generator=torch.Generator().manual_seed(5)).cuda()
    model.cuda()
    outcomes = []
    for _ in range(5):
        rows, kept = values.cuda(), state.cuda()
        loss, (d_relations,) = model.fused_step(rows, kept, positions, relations.cuda(), rule.row_step())
        outcomes.append([x.cpu() for x in (loss, rows, kept, d_relations)])
    assert all(all(torch.equal(a, b) for a, b in zip(outcomes[0], other)) for other in outcomes[1:])
