"""Every way an ensemble comes in goes through one protocol (ensdiag.ensembles), and the user's
objects stay the user's: a hand-written BatchEnsemble given as views of one module gets no
weight-space artefacts, given with its declared effective weights gets them right; diagnose(),
Tracker and the Lightning callback leave modules bit-identical in device, mode, parameters,
buffers and random state."""

import pytest
import torch
from torch import nn

import ensdiag
from ensdiag.ensembles import ADAPTERS, as_ensemble


class BatchLinear(nn.Module):
    """A user's own rank-1 BatchEnsemble layer: W_i = W ∘ r_i s_iᵀ, a bias per member."""

    def __init__(self, k, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in ** 0.5)
        self.r = nn.Parameter(1 + 0.5 * torch.randn(k, d_out))
        self.s = nn.Parameter(1 + 0.5 * torch.randn(k, d_in))
        self.bias = nn.Parameter(0.1 * torch.randn(k, d_out))

    def forward(self, x):  # x [k, B, d_in]
        return (x * self.s[:, None]) @ self.weight.T * self.r[:, None] + self.bias[:, None]


class MyBatchEnsemble(nn.Module):
    def __init__(self, k=4, declare=True):
        super().__init__()
        self.num_members = k
        self.one, self.two = BatchLinear(k, 12, 16), BatchLinear(k, 16, 3)
        if declare:
            self.member_weights = self._effective

    def forward(self, x):
        h = torch.relu(self.one(x.expand(self.num_members, *x.shape)))
        return self.two(h)  # [k, B, C]

    def _effective(self):
        return [{f"{name}.weight": layer.weight * layer.r[i][:, None] * layer.s[i][None, :] for name, layer in
                 (("one", self.one), ("two", self.two))} | {f"{name}.bias": layer.bias[i] for name, layer in
                                                              (("one", self.one), ("two", self.two))}
                for i in range(self.num_members)]


class View(nn.Module):
    """Member i of a BatchEnsemble as the natural first attempt writes it: a view of one module."""

    def __init__(self, ensemble, i):
        super().__init__()
        self.ensemble, self.i = ensemble, i

    def forward(self, x):
        return self.ensemble(x)[self.i]


def _data(n=80, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _dense_cosine(be):
    """Members' effective weights rebuilt in float64 from the raw parameters, independently of ensdiag."""
    flat = []
    for i in range(be.num_members):
        parts = []
        for layer in (be.one, be.two):
            w, r, s = (t.detach().double() for t in (layer.weight, layer.r[i], layer.s[i]))
            parts += [(w * torch.outer(r, s)).flatten(), layer.bias[i].detach().double()]
        flat.append(torch.cat(parts))
    flat = torch.stack(flat)
    flat = flat / flat.norm(dim=1, keepdim=True)
    return flat @ flat.T


WEIGHT_SPACE = ("weight-similarity", "cka", "paths", "alignment", "rank-structure")


def test_views_of_one_batch_ensemble_get_no_weight_space_numbers_and_say_why():
    torch.manual_seed(0)
    be = MyBatchEnsemble(declare=False)
    diagnosis = ensdiag.diagnose([View(be, i) for i in range(4)], test=_data(), train=_data(seed=1))
    found = diagnosis.metrics["analyzers"]
    assert found["disagreement"]["status"] == "ok"  # predictions are every member's own
    for name in WEIGHT_SPACE:
        assert found[name]["status"] == "skipped" and "share parameter storage" in found[name]["reason"], name
    assert "member_weights" in found["weight-similarity"]["reason"]  # and how to fix it


def test_a_declared_batch_ensemble_gets_the_effective_weight_cosine():
    torch.manual_seed(0)
    be = MyBatchEnsemble()
    expected = _dense_cosine(be)
    found = ensdiag.diagnose(be, test=_data()).metrics["analyzers"]
    torch.testing.assert_close(torch.tensor(found["weight-similarity"]["matrix"]["value"], dtype=torch.float64),
                               expected, atol=1e-6, rtol=0)
    assert found["rank-structure"]["status"] == "ok" and found["rank-structure"]["rank_one"]["value"] == 1.0
    assert not found["rank-structure"]["construction_check"]  # a user's module: no "by construction" caption
    assert "member_network" in found["paths"]["reason"]  # what would add paths and CKA
    # the same weights declared for views of the module
    views = ensdiag.diagnose(ensdiag.as_ensemble([View(be, i) for i in range(4)], member_weights=be.member_weights),
                             test=_data())
    torch.testing.assert_close(torch.tensor(views.metrics["analyzers"]["weight-similarity"]["matrix"]["value"],
                                            dtype=torch.float64), expected, atol=1e-6, rtol=0)


def test_a_tracker_of_views_has_no_weight_cosine_and_says_why():
    torch.manual_seed(0)
    be = MyBatchEnsemble(declare=False)
    tracker = ensdiag.Tracker([View(be, i) for i in range(4)], val=_data())
    row = tracker.measure(0)
    assert row["weight_cosine"] is None and row["disagreement"] is not None
    assert "share parameter storage" in tracker.weights_skipped
    declared = ensdiag.Tracker(MyBatchEnsemble(), val=_data()).measure(0)
    assert declared["weight_cosine"] is not None and declared["weight_cosine"] < 0.99


class Noisy(nn.Module):
    """Dropout and BatchNorm: a measurement in training mode would change outputs and statistics."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


def _snapshot(modules):
    return {"modes": [[m.training for m in module.modules()] for module in modules],
            "state": [{key: value.clone() for key, value in module.state_dict().items()} for module in modules],
            "rng": torch.get_rng_state()}


def _assert_untouched(before, modules):
    after = _snapshot(modules)
    assert after["modes"] == before["modes"]
    for old, new in zip(before["state"], after["state"]):
        assert old.keys() == new.keys() and all(torch.equal(old[key], new[key]) for key in old)
    assert torch.equal(after["rng"], before["rng"])


@pytest.fixture
def no_moves(monkeypatch):
    """Records every module `_apply` (what .to(), .cuda(), .float() … go through) runs on."""
    moved = []
    original = nn.Module._apply

    def recording(self, *args, **kwargs):
        moved.append(id(self))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(nn.Module, "_apply", recording)
    return moved


def test_diagnose_leaves_the_users_modules_bit_identical(no_moves):
    torch.manual_seed(0)
    members = [Noisy() for _ in range(3)]
    members[1].eval()  # modes differ between members: each is restored as it was
    ood = torch.randn(30, 12)
    before = _snapshot(members)
    ensdiag.diagnose(members, test=_data(), ood=ood, train=_data(seed=1), context=ensdiag.Context(device="cpu"))
    _assert_untouched(before, members)
    ids = {id(m) for member in members for m in member.modules()}
    assert not ids & set(no_moves)  # nothing was moved (or cast), not even to the device it is on


def test_diagnose_measures_in_eval_mode_whatever_the_modules_mode():
    torch.manual_seed(0)
    members = [Noisy() for _ in range(2)]
    x, y = _data()
    first = ensdiag.diagnose(members, test=(x, y), measure=ensdiag.Measure(geometry=False)).predictions["id"]["logits"]
    for member in members:
        member.eval()
    with torch.no_grad():
        expected = torch.stack([member(x) for member in members])
    torch.testing.assert_close(first, expected)


def test_the_tracker_leaves_the_users_modules_bit_identical(no_moves):
    torch.manual_seed(0)
    members = [Noisy() for _ in range(3)]
    before = _snapshot(members)
    tracker = ensdiag.Tracker(members, val=_data())
    tracker.measure(0)
    tracker.measure(1)
    _assert_untouched(before, members)
    assert not {id(m) for member in members for m in member.modules()} & set(no_moves)


def test_the_lightning_callback_leaves_the_module_as_it_was(tmp_path):
    lightning = pytest.importorskip("lightning")
    from ensdiag.lightning import DiversityCallback

    class Members(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.members = nn.ModuleList([Noisy() for _ in range(3)])

        def forward(self, x):
            return torch.stack([m(x) for m in self.members])

        def training_step(self, batch, _):
            return sum(nn.functional.cross_entropy(m(batch[0]), batch[1]) for m in self.members)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    torch.manual_seed(0)
    module = Members()
    module.train()
    before = _snapshot([module])
    callback = DiversityCallback(_data(seed=1), path=tmp_path / "d.jsonl")
    trainer = lightning.Trainer(max_epochs=1, limit_train_batches=0, callbacks=[callback], logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                accelerator="cpu", devices=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_data()), batch_size=16)
    trainer.fit(module, loader)
    assert callback.rows and callback.rows[0]["disagreement"] is not None
    after = _snapshot([module])
    for old, new in zip(before["state"], after["state"]):
        assert all(torch.equal(old[key], new[key]) for key in old)  # BatchNorm's statistics untouched
    # (the global random state is not compared here: Lightning's own loop may draw from it)


def test_the_callback_measures_with_dropout_off():
    lightning = pytest.importorskip("lightning")  # noqa: F841
    from ensdiag.lightning import DiversityCallback
    torch.manual_seed(0)
    module = nn.ModuleList([Noisy() for _ in range(2)])
    module.train()
    ensemble = DiversityCallback(_data(), num_members=2)._members(_Stacked(module))
    x = _data()[0]
    from ensdiag.ensembles import measuring
    with measuring(ensemble), torch.no_grad():
        twice = ensemble(x), ensemble(x)
    torch.testing.assert_close(*twice)  # deterministic: no dropout while measured
    assert all(m.training for m in module.modules())


class _Stacked(nn.Module):
    def __init__(self, members):
        super().__init__()
        self.members = members

    def forward(self, x):
        return torch.stack([m(x) for m in self.members])


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_every_adapter_is_reachable_and_gives_logits_members_first(name, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(5, 1, 8, 8)
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 10, (1, 8, 8))
    plain = [nn.Sequential(nn.Flatten(), nn.Linear(64, 10)) for _ in range(2)]
    given = {"ensdiag model": model, "model files": ensdiag.save_model(model, tmp_path / "m.safetensors"),
             "a list of nn.Modules": plain, "one nn.Module for all members": _Stacked(nn.ModuleList(plain)),
             "a callable": lambda batch: torch.stack([p(batch) for p in plain])}[name]
    ensemble = as_ensemble(given)
    with torch.no_grad():
        assert ensemble(x).shape == (2, 5, 10)
    assert ensemble.num_members == 2


def test_two_dimensional_logits_say_what_shape_is_expected():
    with pytest.raises(ValueError, match=r"logits \[k, B, C\].*num_members"):
        ensdiag.diagnose(nn.Linear(12, 3), test=_data())
    one = ensdiag.diagnose(ensdiag.as_ensemble(nn.Linear(12, 3), num_members=1), test=_data(),
                           measure=ensdiag.Measure(geometry=False))  # a single model, said so
    assert one.metrics["num_members"] == 1


@pytest.mark.parametrize("members,error,match", [
    ([nn.Linear(12, 3), nn.Linear(12, 4)], ValueError, r"member 1 returned logits of shape \(80, 4\)"),
    ([nn.Linear(12, 3), nn.LSTM(12, 3)], TypeError, "member 1 returned a tuple"),
])
def test_members_that_do_not_fit_together_are_value_or_type_errors(members, error, match):
    with pytest.raises(error, match=match):
        ensdiag.diagnose(members, test=_data())


@pytest.mark.parametrize("data,error,match", [
    ((torch.randn(8, 12), torch.full((8,), 5)), ValueError, "out of range 0..2"),
    ((torch.randn(8, 12), torch.zeros(8)), TypeError, "labels must be integers"),
    ((torch.randn(0, 12), torch.zeros(0, dtype=torch.long)), ValueError, "no in-distribution examples|empty"),
])
def test_bad_data_from_python_is_a_documented_error(data, error, match):
    from ensdiag.errors import EnsdiagError
    with pytest.raises(error, match=match) as caught:
        ensdiag.diagnose([nn.Linear(12, 3), nn.Linear(12, 3)], test=data)
    assert isinstance(caught.value, EnsdiagError)


def test_a_deliberate_eval_mode_mc_dropout_is_measured_as_it_is():
    """A module in eval mode with its dropout switched back on (the usual MC Dropout recipe) keeps
    it while measured; its BatchNorm statistics still never update."""
    torch.manual_seed(0)

    class MCDropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.drop = nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16)), nn.Dropout(0.5)
            self.head = nn.Linear(16, 3)

        def forward(self, x):  # k = 4 stochastic passes, members first
            return torch.stack([self.head(self.drop(self.body(x))) for _ in range(4)])

    model = MCDropout().eval()
    model.drop.train()  # dropout on at test time, on purpose
    model.body[1].train()  # a stray BatchNorm in training mode: measured in eval mode all the same
    before = _snapshot([model])
    found = ensdiag.diagnose(model, test=_data(), measure=ensdiag.Measure(geometry=False)).metrics["analyzers"]
    assert found["disagreement"]["splits"]["id"]["mean"]["value"] > 0  # the members differ: dropout was on
    _assert_untouched(before, [model])


def test_the_users_tensors_are_never_changed_in_place():
    x, y = _data()
    original = x.clone()
    ensdiag.diagnose([nn.Linear(12, 3), nn.Linear(12, 3)], test=(x, y), normalize=lambda b: b.sub_(0.5),
                     measure=ensdiag.Measure(geometry=False))
    assert torch.equal(x, original)


def test_disjoint_slices_of_one_buffer_are_not_shared_parameters():
    from ensdiag.ensembles.modules import shared_storage
    flat = torch.randn(2 * 36)
    members = [nn.Linear(12, 3) for _ in range(2)]
    for i, member in enumerate(members):  # member i's weight and bias live in their own slice of `flat`
        member.weight = nn.Parameter(flat[36 * i:36 * i + 36].view(3, 12))
        del member.bias
        member.register_parameter("bias", None)
    assert shared_storage(members) is None
    assert shared_storage([members[0], members[0]]) is not None  # the same module twice is


def test_members_of_other_layouts_are_compared_on_what_they_share_and_say_so():
    wide, narrow = (nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 3)) for width in (32, 16))
    found = ensdiag.diagnose([wide, narrow], test=_data(), train=_data(seed=1)).metrics["analyzers"]
    assert set(found["weight-similarity"]["layers"]) == {"2"} and "1 of 4 parameters" in found["weight-similarity"]["scope"]
    assert found["paths"]["status"] == "skipped" and "different layers or shapes" in found["paths"]["reason"]


@pytest.mark.parametrize("call,error,match", [
    (lambda members: {"context": ensdiag.Context(device="meta")}, ValueError, "never moves your modules"),
    (lambda members: {"context": ensdiag.Context(cost=5)}, TypeError, "cost must be a dict"),
    (lambda members: {"measure": ensdiag.Measure(geometry=True, geometry_examples=0)}, ValueError,
     "geometry_examples must be a whole number in 1"),
    (lambda members: {"context": ensdiag.Context(titles={"tset": "x"})}, ValueError, "did you mean 'test'"),
    (lambda members: {"members": ensdiag.as_ensemble(members, num_members=3)}, ValueError,
     "num_members = 3 but 2 member modules"),
    (lambda members: {"normalize": ([0.5, 0.5], [0.2, 0.2])}, ValueError, "cannot be normalised per channel"),
])
def test_arguments_from_python_are_checked_in_one_line(call, error, match):
    members = [nn.Linear(12, 3), nn.Linear(12, 3)]
    with pytest.raises(error, match=match):
        ensdiag.diagnose(**{"members": members, "test": _data(), "measure": ensdiag.Measure(geometry=False),
                            **call(members)})
