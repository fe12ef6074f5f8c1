"""cadence.kge_step: the KGE training step as one operator against autograd's path through
``KgeModel.loss_at`` followed by the row optimizer's own step (the reference): bit for bit for DistMult
and ComplEx against one shared pool, within float32 rounding for every other scorer and layout."""

from __future__ import annotations

import pytest
import torch

from cadence import kernels, kge_step
from tests.conftest import needs_cuda

STEP_CASES = [(name, reciprocal, loss, optimizer) for name in ("distmult", "complex") for reciprocal in (False, True)
              for loss in ("logistic", "softmax") for optimizer in ("rowwise_adagrad", "adagrad")]
SCORERS = [("distmult",), ("complex",), ("transe", "model.p_norm=1"), ("transe", "model.p_norm=2"), ("rotate",)]


def step_setting(name: str, reciprocal: bool, loss: str, optimizer: str, *more: str, edges: int = 8, chunks: int = 1,
                 ids: int = 21):
    """A KGE model, a batch's rows (``ids`` unique of 40, ids repeating among heads, tails and
    candidates, width 6, the complex scorers' 3 halves), its positions (the edges' heads and tails,
    then ``chunks`` pools of 9 candidates) and relations, and the row rule."""
    from cadence.config import load_config
    from cadence.models.kge import KgeModel
    from cadence.optim import ENTITY_OPTIMIZERS

    config = load_config(None, [f"model.name={name}", "model.dim=6", "train.negatives=9", f"train.loss={loss}",
                                f"train.reciprocal={str(reciprocal).lower()}", f"optimizer.entity={optimizer}",
                                "optimizer.lr=0.3", *more])
    model = KgeModel(config, 5)
    rule = ENTITY_OPTIMIZERS.get(optimizer)(config.optimizer)
    generator = torch.Generator().manual_seed(3)
    values = torch.randn(ids, 6, generator=generator)
    state = torch.rand(ids, rule.state_width(6), generator=generator)
    positions = torch.randint(0, ids, (2 * edges + 9 * chunks,), generator=generator)
    return model, rule, values, state, positions, torch.randint(0, 5, (edges,), generator=generator)


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


def fused_step(model, rule, values, state, positions, relations):
    fused = model.fused_step(values, state, positions, relations, rule.row_step())
    assert fused is not None, "every shipped scorer under Adagrad's rows takes the fused step"
    loss, (d_relations,) = fused
    return loss, values, state, d_relations


@pytest.mark.parametrize("name, reciprocal, loss, optimizer", STEP_CASES)
def test_the_fused_step_is_autograds_step_bit_for_bit(name: str, reciprocal: bool, loss: str, optimizer: str) -> None:
    model, rule, values, state, positions, relations = step_setting(name, reciprocal, loss, optimizer)
    expected = autograd_step(model, rule, values, state, positions, relations)
    for mine, theirs in zip(fused_step(model, rule, values, state, positions, relations), expected):
        assert torch.equal(mine, theirs)


LAYOUTS = pytest.mark.parametrize("edges, chunks", [(8, 1), (8, 2), (7, 3)],
                                  ids=["shared", "2 chunks", "3 chunks, padded"])


@LAYOUTS
@pytest.mark.parametrize("reciprocal, loss", [(False, "logistic"), (True, "softmax")])
@pytest.mark.parametrize("scorer", SCORERS, ids=lambda s: " ".join(s))
def test_every_scorer_and_layout_takes_a_fused_step_bit_for_bit_autograds(scorer, reciprocal: bool, loss: str,
                                                                          edges: int, chunks: int) -> None:
    model, rule, values, state, positions, relations = step_setting(scorer[0], reciprocal, loss, "rowwise_adagrad",
                                                                    *scorer[1:], "model.gamma=3.0", edges=edges,
                                                                    chunks=chunks)
    expected = autograd_step(model, rule, values, state, positions, relations)
    for mine, theirs in zip(fused_step(model, rule, values, state, positions, relations), expected):
        assert torch.equal(mine, theirs)


def scorer_forms(scorer, h, r, t, pool, both: bool, chunks: int):
    """The reference: the scorer's own forms (``score_tails``, ``score_heads``, ``score``), chunk by
    chunk: chunk k's ceil(B / K) edges against pool k, tail sides' rows then head sides'."""
    step, pools = -(-h.shape[0] // chunks), pool.view(chunks, -1, pool.shape[1])
    parts = [(slice(k * step, (k + 1) * step), pools[k]) for k in range(chunks)]
    tails = torch.cat([scorer.score_tails(h[edges], r[edges], candidates) for edges, candidates in parts])
    heads = [scorer.score_heads(candidates, r[edges], t[edges]) for edges, candidates in parts]
    return (torch.cat([tails, *heads]) if both else tails), scorer.score(h, r, t)


@LAYOUTS
@pytest.mark.parametrize("both", [True, False])
@pytest.mark.parametrize("scorer", SCORERS, ids=lambda s: " ".join(s))
def test_the_scores_operator_is_the_scorers_forms_under_autograd(scorer, both: bool, edges: int, chunks: int) -> None:
    """``kge_scores``' forward and backward (what the fused step repeats) against autograd through the
    scorer's plain forms, in float64; the gradients of a loss that weighs each output at random."""
    from cadence.config import ModelConfig
    from cadence.models.scorers import SCORERS as REGISTERED

    config = ModelConfig(name=scorer[0], dim=6, gamma=3.0, p_norm=int(scorer[1][-1]) if scorer[1:] else 1)
    form = REGISTERED.get(scorer[0])(config)
    generator = torch.Generator().manual_seed(11)
    h, t = (torch.randn(edges, 6, generator=generator, dtype=torch.float64) for _ in range(2))
    r = torch.randn(edges, form.relation_dim(), generator=generator, dtype=torch.float64)
    pool = torch.randn(9 * chunks, 6, generator=generator, dtype=torch.float64)
    leaves, twins = [x.requires_grad_() for x in (h, r, t, pool)], [x.detach().clone().requires_grad_()
                                                                       for x in (h, r, t, pool)]
    name, gamma = form.step_scoring()
    got = kge_step.kge_scores(*leaves, name, gamma, both, chunks)
    expected = scorer_forms(form, *twins, both, chunks)
    weights = [torch.randn(x.shape, generator=generator, dtype=torch.float64) for x in expected]
    for outputs in (got, expected):
        sum((output * weight).sum() for output, weight in zip(outputs, weights)).backward()
    for mine, theirs in zip([*got, *(x.grad for x in leaves)], [*expected, *(x.grad for x in twins)]):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


def test_the_scores_operator_differentiates_through_either_output_alone() -> None:
    """A loss that reads only the scores, or only the positives: the other output's gradient is zeros."""
    from cadence.config import ModelConfig
    from cadence.models.scorers import SCORERS as REGISTERED

    form = REGISTERED.get("distmult")(ModelConfig(name="distmult", dim=6))
    for pick in (0, 1):
        generator = torch.Generator().manual_seed(pick)
        inputs = [torch.randn(n, 6, generator=generator, dtype=torch.float64) for n in (8, 8, 8, 9)]
        leaves, twins = [x.requires_grad_() for x in inputs], [x.detach().clone().requires_grad_() for x in inputs]
        kge_step.kge_scores(*leaves, "distmult", 0.0, True, 1)[pick].sum().backward()
        scorer_forms(form, *twins, True, 1)[pick].sum().backward()
        for mine, leaf in zip(leaves, twins):  # (the positives do not read the pool)
            expected = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            torch.testing.assert_close(mine.grad, expected, rtol=1e-10, atol=1e-12)


def test_the_distances_gradients_in_blocks_of_candidates_are_their_gradients_at_once(monkeypatch) -> None:
    """A [queries x candidates x D] difference bounded by ``ELEMENTS`` floats: many blocks give what one gives."""
    model, rule, values, state, positions, relations = step_setting("rotate", False, "logistic", "rowwise_adagrad",
                                                                    chunks=2)
    whole = fused_step(model, rule, values.clone(), state.clone(), positions, relations)
    monkeypatch.setattr(kge_step, "ELEMENTS", 6 * 16 * 2)  # two candidates a block
    for mine, theirs in zip(fused_step(model, rule, values, state, positions, relations), whole):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("chunks", [1, 3])
def test_the_chunked_layout_puts_each_edge_beside_its_chunks_pool(chunks: int) -> None:
    """Edge i of side s is row s c + i % c of chunk i // c (c = ceil(B / K)), the rest zeros; and back."""
    sides, size = 2, 7
    rows = torch.arange(1.0, sides * size + 1).unsqueeze(1)
    laid = kge_step.to_chunks(rows, sides, size, chunks)
    step = -(-size // chunks)
    for side in range(sides):
        for edge in range(size):
            assert laid[edge // step, side * step + edge % step, 0] == rows[side * size + edge, 0]
    assert int((laid == 0).sum()) == chunks * sides * step - sides * size
    assert torch.equal(kge_step.from_chunks(laid, sides, size), rows)


@pytest.mark.skipif(not kernels.INTERPRETED, reason="Triton's interpreter (tests/conftest.py) is not on here")
@pytest.mark.parametrize("name, reciprocal, loss", [(n, r, l) for n, r, l, o in STEP_CASES if o == "rowwise_adagrad"])
def test_the_fused_steps_kernels_in_tritons_interpreter_are_autograds_step(name: str, reciprocal: bool, loss: str) -> None:
    model, rule, values, state, positions, relations = step_setting(name, reciprocal, loss, "rowwise_adagrad")
    expected = autograd_step(model, rule, values, state, positions, relations)
    step = rule.row_step()
    got_loss, d_relations = kge_step.kge_step_parts(
        values, state, positions, model.relations.detach(), relations, name, 0.0, not reciprocal,
        loss == "softmax", 1, step.lr, step.eps, step.rowwise, kernel=True)
    for mine, theirs in zip((got_loss, values, state, d_relations), expected):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("name, reciprocal, loss", [(n, r, l) for n, r, l, o in STEP_CASES if o == "rowwise_adagrad"])
def test_the_fused_step_on_cuda_is_autograds_step(name: str, reciprocal: bool, loss: str) -> None:
    model, rule, values, state, positions, relations = step_setting(name, reciprocal, loss, "rowwise_adagrad")
    expected = autograd_step(model, rule, values, state, positions, relations)
    cuda = [x.cuda() for x in (values, state, positions, relations)]
    model.cuda()
    for mine, theirs in zip(fused_step(model, rule, *cuda), expected):
        torch.testing.assert_close(mine.cpu(), theirs, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("scorer", SCORERS[2:], ids=lambda s: " ".join(s))
def test_the_distance_scorers_fused_steps_on_cuda_are_autograds_step(scorer) -> None:
    model, rule, values, state, positions, relations = step_setting(scorer[0], False, "logistic", "rowwise_adagrad",
                                                                    *scorer[1:], chunks=2)
    expected = autograd_step(model, rule, values, state, positions, relations)
    cuda = [x.cuda() for x in (values, state, positions, relations)]
    model.cuda()
    for mine, theirs in zip(fused_step(model, rule, *cuda), expected):
        torch.testing.assert_close(mine.cpu(), theirs, rtol=1e-4, atol=1e-5)


def test_a_regulariser_takes_autograds_path() -> None:
    model, rule, values, state, positions, relations = step_setting("distmult", False, "logistic", "rowwise_adagrad",
                                                                     "train.regularizer=n3", "train.reg_weight=0.01")
    assert model.fused_step(values, state, positions, relations, rule.row_step()) is None


def test_frozen_relations_take_autograds_path() -> None:
    from cadence.config import load_config
    from cadence.models.kge import KgeModel

    config = load_config(None, ["model.name=distmult", "model.dim=6", "train.negatives=9"])
    model = KgeModel(config, 5, frozen_relations=torch.tensor([True, False, False, False, False]))
    _, rule, values, state, positions, relations = step_setting("distmult", False, "logistic", "rowwise_adagrad")
    assert model.fused_step(values, state, positions, relations, rule.row_step()) is None


def test_the_fused_steps_operator_has_its_outputs_shapes_for_tracing() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, rule, values, state, positions, relations = step_setting("distmult", False, "logistic", "rowwise_adagrad")
    with FakeTensorMode(allow_non_fake_inputs=True):
        loss, d_relations = torch.ops.cadence.kge_step(values, state, positions, model.relations.detach(),
                                                       relations, "distmult", 0.0, True, False, 1, 0.1, 1e-10, True)
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
        outcomes.append([x.cpu() for x in fused_step(model, rule, rows, kept, positions, relations.cuda())])
    assert all(all(torch.equal(a, b) for a, b in zip(outcomes[0], other)) for other in outcomes[1:])
