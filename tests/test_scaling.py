"""Temperature scaling's one solver (stats/scaling.py): every temperature ensdiag fits comes from it, so it is
checked here against SciPy's bounded scalar minimiser on the same loss, for the NLL and the Brier score, with the
rule that a fit without an error to fit on keeps T = 1."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from ensdiag.stats import scaling as S


def _reference(z: np.ndarray, labels: np.ndarray, loss: str) -> float:
    """β minimising the mean loss of softmax(β·z), by SciPy on [LOW, HIGH] (bounded Brent, to 1e-12)."""
    def mean_loss(beta):
        scaled = beta * z - (beta * z).max(1, keepdims=True)
        q = np.exp(scaled) / np.exp(scaled).sum(1, keepdims=True)
        if loss == "nll":
            return -np.log(q[np.arange(len(labels)), labels]).mean()
        return ((q - np.eye(z.shape[1])[labels]) ** 2).sum(1).mean()
    return minimize_scalar(mean_loss, bounds=(S.LOW, S.HIGH), method="bounded", options={"xatol": 1e-12}).x


@pytest.mark.parametrize("loss", ["nll", "brier"])
def test_every_rows_beta_is_scipys_minimum(loss):
    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([0.3, 1.0, 3.0, 8.0])[:, None, None]  # under- to over-confident rows
    labels = torch.randint(0, 5, (4, 150), generator=generator)
    logits = scales * (torch.randn(4, 150, 5, generator=generator, dtype=torch.float64)
                       + 1.5 * torch.nn.functional.one_hot(labels, 5))
    z = torch.log_softmax(logits, -1)
    found = S.fit_betas(z, labels, loss)
    for row in range(4):
        assert found[row].item() == pytest.approx(_reference(z[row].numpy(), labels[row].numpy(), loss), rel=1e-5)


def test_padding_does_not_count_and_one_temperature_is_the_batched_fit():
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 3, (80,), generator=generator)
    z = torch.log_softmax(2 * torch.randn(80, 3, generator=generator, dtype=torch.float64), -1)
    padded = torch.cat([z, torch.zeros(20, 3, dtype=torch.float64)])[None]
    inside = (torch.arange(100) < 80).double()[None]
    beta = S.fit_betas(padded, torch.cat([labels, torch.zeros(20, dtype=torch.long)])[None], "nll", inside)
    assert beta.item() == pytest.approx(_reference(z.numpy(), labels.numpy(), "nll"), rel=1e-5)
    assert S.fit_temperature(z, labels) == pytest.approx(1 / beta.item(), rel=1e-12)


def test_a_row_without_an_error_keeps_its_predictions_unscaled_and_is_said():
    """Without a wrong top label the loss falls all the way to T = 0.02 (every prediction sharpened to certainty):
    no evidence for a temperature, so T = 1, and the note counts it; a fit that still ends at a bound is named too."""
    labels = torch.arange(40) % 4
    right = torch.log_softmax(0.5 * torch.nn.functional.one_hot(labels, 4).double() + 0.1, -1)  # all right
    noise = torch.log_softmax(torch.randn(40, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64), -1)
    z = torch.stack([right, noise, -right])  # all right; noise (flattened to the bound T = 50); all wrong
    beta = S.fit_betas(z, labels.expand(3, -1))
    fitted = S.informative(z, labels.expand(3, -1), torch.ones(3, 40))
    assert fitted.tolist() == [False, True, False] and beta[0] == beta[2] == 1.0
    assert _reference(right.numpy(), labels.numpy(), "nll") == pytest.approx(S.HIGH, rel=1e-3)  # what T = 1 avoids
    assert S.fit_notes(beta, fitted, "fits") == ("2 of 3 fits had no error (or no correct prediction) to fit a "
                                                 "temperature on: T = 1 there; 1 of 3 fits ran to a bound of the range "
                                                 "searched (T = 0.02 or 50)")


def test_fold_assignments_are_seeded_balanced_and_differ_between_repeats():
    first, again = S.folds("id", 103), S.folds("id", 103)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert sorted(torch.bincount(first[0]).tolist()) == [20, 20, 21, 21, 21]
    assert not torch.equal(first[0], S.folds("id", 103, repeat=1)[0])
    fold, place = S.folds("shift", 10, blocks=3)  # each input's three corruptions keep its fold
    assert torch.equal(fold[:10], fold[10:20]) and torch.equal(fold[:10], fold[20:])
    chosen = S.fitting_sets(*first, most=50)
    assert all(len(part) == 50 and not (first[0][part] == j).any() for j, part in enumerate(chosen))
