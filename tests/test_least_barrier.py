"""The least barrier over weight matching's restarts (geometry/least.py) against an independent
weight matching written here: SciPy's linear assignment, NumPy's random generator, this file's own
interpolation and cross-entropy, on a Deep Ensemble pair trained by ensdiag on the embedded digits."""

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from ensdiag.analysis import analyze_model
from ensdiag.analysis.geometry import ModelProbe
from ensdiag.config import preset_config
from ensdiag.data import get_dataset
from ensdiag.data.batching import Normalize
from ensdiag.data.preset import holdout
from ensdiag.geometry.least import PATIENCE
from ensdiag.nn import build_model
from ensdiag.train import FitData, fit

INDEPENDENT_RESTARTS = 24


@pytest.fixture(scope="module")
def digits_pair(tmp_path_factory):
    """(model, probe, test split, normalize): two Deep Ensemble members trained by ensdiag on digits
    (its preset's optimiser, 20 epochs, no early stopping), probed as `ensdiag diversity` probes
    them, with intervals."""
    config = preset_config("digits", methods=["deep-ensemble"], members=2, epochs=20, early_stopping=False)
    train, test = get_dataset("digits").load(split="train"), get_dataset("digits").load(split="test")
    kept, held = holdout(len(train), config.val_fraction, 42)
    normalize = Normalize(config.mean, config.std)
    torch.manual_seed(42)
    model = build_model("mlp", "deep-ensemble", 2, 10, config.input_shape)
    data = FitData(train.images[kept], train.labels[kept], train.images[held], train.labels[held], normalize)
    fit(model, config, data, 42, tmp_path_factory.mktemp("pair") / "state.pt", "cpu")
    model.eval()
    probe = ModelProbe(model, {"id": test}, normalize, train.images[kept], train_labels=train.labels[kept], detail=True)
    return model, probe, test, normalize


# ------------------------------------------------------------------ the independent implementation

def _layers(model, member) -> list[tuple[np.ndarray, np.ndarray]]:
    state = model.member_state_dict(member)
    names = sorted({key.rsplit(".", 1)[0] for key in state if key.startswith("hidden.")}) + ["head"]
    return [(state[f"{name}.weight"].detach().double().numpy(), state[f"{name}.bias"].detach().double().numpy()) for name in names]


def _match(mine, theirs, rng) -> list:
    """Weight matching from a random start: each hidden layer's units permuted to maximise the summed
    inner products of every weight and bias they touch, one layer at a time in a random order."""
    perms = [rng.permutation(len(bias)) for _, bias in theirs[:-1]]
    for _ in range(200):
        improved = False
        for layer in rng.permutation(len(perms)):
            (w_a, b_a), (w_b, b_b) = mine[layer], theirs[layer]
            into = perms[layer - 1] if layer else np.arange(w_b.shape[1])
            after = perms[layer + 1] if layer + 1 < len(perms) else np.arange(len(theirs[layer + 1][1]))
            score = w_a @ w_b[:, into].T + np.outer(b_a, b_b) + mine[layer + 1][0].T @ theirs[layer + 1][0][after, :]
            _, best = linear_sum_assignment(score, maximize=True)
            rows = np.arange(len(best))
            now = score[rows, perms[layer]].sum()
            if score[rows, best].sum() > now + 1e-12 * abs(now):
                perms[layer], improved = best, True
        if not improved:
            break
    out, into = [], np.arange(theirs[0][0].shape[1])
    for layer, (weight, bias) in enumerate(theirs):
        order = perms[layer] if layer < len(perms) else np.arange(len(bias))
        out.append((weight[order][:, into], bias[order]))
        into = order
    return out


def _loss(layers, x, y) -> float:
    h = x
    for weight, bias in layers[:-1]:
        h = np.maximum(h @ weight.T + bias, 0.0)
    logits = h @ layers[-1][0].T + layers[-1][1]
    top = logits.max(1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    return float((log_sum - logits[np.arange(len(y)), y]).mean())


def _barrier(mine, theirs, x, y) -> float:
    ts = np.linspace(0, 1, 11)
    losses = [_loss([((1 - t) * wa + t * wb, (1 - t) * ba + t * bb) for (wa, ba), (wb, bb) in zip(mine, theirs)], x, y)
              for t in ts]
    return max(loss - ((1 - t) * losses[0] + t * losses[-1]) for t, loss in zip(ts, losses))


def _independent_barriers(model, test, normalize, restarts=INDEPENDENT_RESTARTS) -> list[float]:
    x = normalize(test.images).flatten(1).double().numpy()
    y = test.labels.numpy()
    mine, theirs = _layers(model, 0), _layers(model, 1)
    return [_barrier(mine, _match(mine, theirs, np.random.default_rng(1000 + restart)), x, y) for restart in range(restarts)]


# ------------------------------------------------------------------ the tests

def test_no_independent_restart_finds_a_barrier_below_the_printed_interval(digits_pair):
    """24 restarts of an independent weight matching (random starts and orders, its own seeds) find no
    test-loss barrier below ensdiag's least by more than its printed interval reaches; the independent
    losses at the ends are ensdiag's (the same network, read two ways)."""
    model, probe, test, normalize = digits_pair
    paths = analyze_model(probe, only=["alignment", "paths"])["paths"]
    least, interval = paths["loss_barrier"]["value"], paths["loss_barrier"]["interval"]
    assert "restarts of weight matching" in interval["method"]  # the interval's definition names the restarts
    found = _independent_barriers(model, test, normalize)
    x = normalize(test.images).flatten(1).double().numpy()
    assert _loss(_layers(model, 0), x, test.labels.numpy()) == pytest.approx(paths["pairs"][0]["loss"][0], abs=1e-5)
    assert interval["low"] <= least <= interval["high"]
    assert min(found) >= interval["low"] - 1e-9, (min(found), least, interval)
    pair = paths["pairs"][0]
    assert pair["restarts_run"] >= PATIENCE + 1 and pair["loss_barrier"] == least
    assert pair["loss_barrier"] == min(r["loss_barrier"] for r in pair["restarts"] if r["complete"])
