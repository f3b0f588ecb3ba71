"""The fast path computes what the plain path computes: member strategies, shared inputs,
prepared batches, and a model trained end to end against the reference pipeline."""

import pytest
import torch

import ensdiag
from ensdiag.bench.reference import ReferenceModel, make_loader
from ensdiag.config import preset_config
from ensdiag.data import get_dataset
from ensdiag.data.batching import Normalize, TrainingImages
from ensdiag.nn import METHODS
from ensdiag.nn.members import STRATEGIES
from ensdiag.train import FitData, fit

from .test_data_embedded import random_crop_flip

SHAPES = {"mlp": (1, 8, 8), "resnet18": (3, 8, 8)}


def _train_step(model, xs):
    """Output, gradients and new state after one training-mode step on a fixed loss."""
    model.train()
    model.zero_grad()
    out = model.forward_members(xs)
    (out.square().mean() + out[..., 0].sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return out.detach(), grads, {name: t.clone() for name, t in model.state_dict().items()}


@pytest.mark.parametrize("arch", SHAPES)
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "stacked"])
def test_vmap_and_loop_members_equal_the_stacked_ensemble(arch, strategy):
    """float64, so the comparison is exact up to rounding, not blurred by ill-conditioned BN."""
    model = ensdiag.build_model(arch, "deep-ensemble", 2, 10, SHAPES[arch]).double()
    xs = torch.randn(2, 4, *SHAPES[arch], dtype=torch.float64)
    start = {name: t.clone() for name, t in model.state_dict().items()}
    expected = _train_step(model, xs)
    model.load_state_dict(start)
    model.member_strategy = strategy
    got = _train_step(model, xs)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-12)
    for name in expected[1]:
        torch.testing.assert_close(got[1][name], expected[1][name], rtol=1e-9, atol=1e-12, msg=name)
    for name in expected[2]:  # BatchNorm running statistics and step count, per member
        torch.testing.assert_close(got[2][name], expected[2][name], rtol=1e-10, atol=1e-12, msg=name)
    model.eval()  # and in evaluation mode, on the running statistics
    evaluated = model.forward_members(xs)
    model.member_strategy = "stacked"
    torch.testing.assert_close(evaluated, model.forward_members(xs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", list(METHODS))
def test_one_batch_for_every_member_takes_the_shared_path_with_the_same_result(method):
    """model(x) expands x (the shared first-layer matmul); a copied batch goes member-major."""
    k = 1 if method == "single" else 4
    model = ensdiag.build_model("mlp", method, k, 10, (1, 8, 8))
    x = torch.randn(5, 1, 8, 8)
    torch.manual_seed(3)
    shared = model(x)
    torch.manual_seed(3)  # the same dropout masks for MC Dropout
    copied = model.forward_members(x.unsqueeze(0).repeat(k, 1, 1, 1, 1))
    torch.testing.assert_close(shared, copied, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("augment", [False, True])
def test_prepared_batches_equal_normalising_and_cropping_each_batch(augment):
    images = torch.randint(0, 256, (20, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(20)
    normalize = Normalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    index = torch.tensor([[3, 7, 1], [19, 0, 7]])
    prepared = TrainingImages(images, labels, normalize, augment=augment)
    got, got_labels = prepared.batch(index, torch.Generator().manual_seed(5))
    raw = images[index.flatten()]
    if augment:  # the same draws, cropping zero-padded raw images before normalising
        raw = random_crop_flip(raw, torch.Generator().manual_seed(5))
    torch.testing.assert_close(got, normalize(raw).unflatten(0, index.shape))
    assert torch.equal(got_labels, labels[index])


def _digits_accuracy_fast_and_reference(seed, state_path, epochs=15):
    # the last epochs at lr/10, so the final accuracy is not one noisy high-lr epoch
    config = preset_config("digits", epochs=epochs, early_stopping=False, milestones=[8])
    train, test = get_dataset("digits").load(split="train"), get_dataset("digits").load(split="test")
    normalize = Normalize(config.mean, config.std)
    torch.manual_seed(seed)
    fast = ensdiag.build_model("mlp", "single", 1, 10, config.input_shape)
    data = FitData(train.images, train.labels, test.images, test.labels, normalize)  # no early stopping
    fit(fast, config, data, seed, state_path, device=torch.device("cpu"))
    with torch.no_grad():
        fast.eval()
        fast_accuracy = (fast(normalize(test.images))[0].argmax(-1) == test.labels).float().mean().item()
    reference = ReferenceModel(config, "single", torch.device("cpu"), seed=seed)
    loader = make_loader(train.images, train.labels, config, config.batch_size, True, 0, torch.device("cpu"), seed=seed)
    for _ in range(epochs):
        reference.train_epoch(loader)
        reference.scheduler.step()
    test_loader = make_loader(test.images, test.labels, config, 500, False, 0, torch.device("cpu"))
    logits = reference.predict(test_loader)
    reference_accuracy = (logits[0].argmax(-1) == test.labels).float().mean().item()
    return fast_accuracy, reference_accuracy


def test_fast_path_single_model_learns_what_the_reference_pipeline_learns(tmp_path):
    pairs = [_digits_accuracy_fast_and_reference(seed, tmp_path / f"state-{seed}.pt") for seed in (1, 2, 3)]
    fast = sum(p[0] for p in pairs) / len(pairs)
    reference = sum(p[1] for p in pairs) / len(pairs)
    assert fast > 0.9 and reference > 0.9
    assert abs(fast - reference) < 0.03, pairs  # seed-to-seed spread of one run here is about 0.01
