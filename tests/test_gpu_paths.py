"""Every branch ensdiag takes on CUDA, run on the CPU (no GPU has ever been available to run them).

bf16 autocast training of every registered method × architecture × member strategy, on
channels-last images with fused optimisers; exact-fp32 predictions and model analyzers; the
arithmetic flags training and prediction set; the synchronised BatchNorm in bf16; what torchrun
on GPUs would call (NCCL, `device_id`, `set_device`, torch's SyncBatchNorm, DDP), through fakes;
CUDA RNG states and resume across devices. docs/gpu.md maps each CUDA path to its test here.
"""

import inspect
from datetime import timedelta

import pytest
import torch

import ensdiag
from ensdiag import distributed
from ensdiag.config import preset_config
from ensdiag.data.batching import Normalize, epoch_permutations
from ensdiag.nn import METHODS
from ensdiag.nn.members import _meta_single
from ensdiag.nn.methods import members_for
from ensdiag.precision import exact_math, training_math
from ensdiag.train import FitData, _restore_rng, _rng_state, make_optimizer, train_epoch

SHAPES = {"mlp": (1, 8, 8), "resnet18": (3, 8, 8)}
ARCH_OPTIONS = {"mlp": None, "resnet18": {"width": 4}}
# every registered method, each member strategy it offers, and both BatchEnsemble variants
CASES = [(arch, method, {}, strategy) for arch in SHAPES for method, kit in METHODS.items()
         for strategy in (kit.strategies or ("stacked",))] + [("resnet18", "batch-ensemble", {"variant": "kernel"}, "stacked")]


def _model(arch, method, options=None, strategy="stacked", members=2):
    model = ensdiag.build_model(arch, method, members_for(method, members), 10, SHAPES[arch],
                                arch_options=ARCH_OPTIONS[arch], **(options or {}))
    model.member_strategy = strategy
    return model


def _fit_data(arch, n=24):
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, *SHAPES[arch]), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    channels = SHAPES[arch][0]
    return FitData(images, labels, images[:8], labels[:8], Normalize((0.5,) * channels, (0.25,) * channels),
                   augment=arch == "resnet18")


@pytest.mark.parametrize("arch, method, options, strategy", CASES,
                         ids=[f"{a}-{m}{'-' + o['variant'] if o else ''}-{s}" for a, m, o, s in CASES])
def test_bf16_autocast_training_runs_every_method_architecture_and_strategy(arch, method, options, strategy):
    """What `train` does on CUDA: bf16 autocast, channels-last convolutions, fused optimiser.
    The Deep Ensemble's stacked linear layers crashed in backward here before 0.5."""
    model = _model(arch, method, options, strategy)
    channels_last = arch != "mlp"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    config = preset_config("digits", methods=[method], members=2, batch_size=8)
    optimizer, _ = make_optimizer(model, config)
    assert optimizer.defaults["fused"] is True  # the fused kernels, as on CUDA
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    data, generator = _fit_data(arch), torch.Generator().manual_seed(0)
    orders = epoch_permutations(len(data.train_images), model.kit.data_orders(), generator, "cpu")
    loss, accuracy = train_epoch(model, optimizer, data, orders, config, generator, autocast=True,
                                 channels_last=channels_last)
    assert torch.isfinite(torch.tensor(loss)) and 0 <= accuracy <= 1
    for name, parameter in model.named_parameters():
        assert parameter.dtype == torch.float32 and torch.isfinite(parameter).all(), name
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())


def test_member_strategies_agree_under_bf16_autocast():
    """vmap runs its members' convolutions and BatchNorm as the stacked layers do under autocast
    (autocast does not reach inside vmap by itself), running statistics included."""
    reference = _model("resnet18", "deep-ensemble")
    xs = torch.randn(2, 6, 3, 8, 8)
    outputs, statistics = {}, {}
    for strategy in ("stacked", "vmap", "loop"):
        model = _model("resnet18", "deep-ensemble", strategy=strategy)
        model.load_state_dict(reference.state_dict())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs[strategy] = model.forward_members(xs).float()
        statistics[strategy] = model.body.bn1.running_var.clone()
        assert model.body.bn1.running_var.dtype == torch.float32
    for strategy in ("vmap", "loop"):
        torch.testing.assert_close(outputs[strategy], outputs["stacked"], rtol=0.05, atol=0.05)
        torch.testing.assert_close(statistics[strategy], statistics["stacked"], rtol=0.02, atol=1e-3)


def _conv_inputs_are_channels_last(modules, run) -> list[str]:
    wrong = []
    hooks = [module.register_forward_pre_hook(
        lambda module, args, name=name: wrong.append(name) if not args[0].is_contiguous(
            memory_format=torch.channels_last) else None)
        for name, module in modules if isinstance(module, torch.nn.Conv2d)]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return wrong


@pytest.mark.parametrize("method, strategy", [(m, s) for m, kit in METHODS.items()
                                              for s in (kit.strategies or ("stacked",)) if s != "vmap"])
def test_every_convolution_reads_channels_last_input_when_training_asks_for_it(method, strategy):
    """Stride checks for the layout `train` uses on CUDA: no convolution converts its input back
    from NCHW (stacking members along the channels used to copy into NCHW). vmap's batched
    tensors cannot be asked for their layout inside vmap, so it is left out."""
    model = _model("resnet18", method, strategy=strategy).to(memory_format=torch.channels_last)
    xs = torch.randn(model.num_members, 4, 3, 8, 8)
    xs = xs.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, xs.shape[:2])  # as train_epoch
    plain = _meta_single("resnet18", 10, SHAPES["resnet18"])  # the network vmap and loop run
    modules = [*model.named_modules(), *plain.named_modules()]
    assert _conv_inputs_are_channels_last(modules, lambda: model.train().forward_members(xs)) == []


def test_vmap_members_run_a_channels_last_model_whose_convolutions_ask_for_their_layout(monkeypatch):
    """cuDNN's convolution asks its input for its layout (`contiguous(memory_format=…)`), which vmap
    does not implement for channels_last: the CUDA bench's ResNet-18 vmap strategy failed so. The
    ask is emulated on the CPU; the members then run in the default layout, with the same numbers."""
    from torch._prims_common import suggest_memory_format
    original = torch.nn.Conv2d._conv_forward

    def asks_for_its_layout(self, x, weight, bias):
        return original(self, x.contiguous(memory_format=suggest_memory_format(x)), weight, bias)

    model = _model("resnet18", "deep-ensemble", strategy="vmap").to(memory_format=torch.channels_last)
    xs = torch.randn(model.num_members, 4, 3, 8, 8)
    xs = xs.flatten(0, 1).contiguous(memory_format=torch.channels_last).unflatten(0, xs.shape[:2])
    expected = model.eval().forward_members(xs)
    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward", asks_for_its_layout)
    assert torch.allclose(model.forward_members(xs), expected, atol=1e-5)


def test_predictions_and_model_analyzers_run_in_exact_fp32_inside_a_training_context():
    """Called where training's settings are in force (autocast on, TF32 and cudnn.benchmark on),
    prediction and the model analyzers still compute in IEEE fp32."""
    from ensdiag.analysis import analyze_model
    from ensdiag.analysis.geometry import ModelProbe
    from ensdiag.data.registry import Split
    from ensdiag.core.predict import predict
    model = _model("resnet18", "deep-ensemble").to(memory_format=torch.channels_last)
    seen = []
    model.body.conv1.register_forward_hook(lambda module, args, output: seen.append(
        (output.dtype, torch.is_autocast_enabled("cpu"), torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)))
    images, labels = torch.randint(0, 256, (12, 3, 8, 8), dtype=torch.uint8), torch.randint(0, 10, (12,))
    normalize = Normalize((0.5,) * 3, (0.25,) * 3)
    with torch.autocast("cpu", dtype=torch.bfloat16), training_math("cuda"):
        logits = predict(model, {"id": Split(images, labels)}, normalize, torch.device("cpu"))["id"]["logits"]
        probe = ModelProbe(model, {"id": Split(images, labels), "ood": Split(images, None)}, normalize, images)
        results = analyze_model(probe, only=["cka", "paths"])
        assert torch.backends.cudnn.allow_tf32 and torch.is_autocast_enabled("cpu")  # restored afterwards
    assert seen and set(seen) == {(torch.float32, False, False, False, False)}
    assert logits.dtype == torch.float32
    with exact_math():
        torch.testing.assert_close(logits, model.eval()(normalize(images)), rtol=0, atol=0)
    assert results["cka"]["status"] == "ok" and results["paths"]["status"] == "ok"


def test_training_turns_on_cudnn_benchmark_and_tf32_only_on_cuda():
    seen = {}
    for device in ("cpu", "cuda"):
        with training_math(device):
            seen[device] = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
                            torch.backends.cuda.matmul.allow_tf32)
    assert seen == {"cpu": (False, False, False), "cuda": (True, True, True)}


def test_cka_moments_stay_on_the_models_device():
    """Geometry accumulates its float64 moments where the representations are (the meta device
    stands in for a GPU here: nothing is copied to the host batch by batch)."""
    from ensdiag.geometry import representations
    networks = [_model("mlp", "single").to("meta").eval() for _ in range(2)]
    devices = []
    original = representations.Moments.add

    def add(self, features):
        original(self, features)
        devices.append(self.gram.device.type)

    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(representations.Moments, "add", add)
        patch.setattr(representations.Moments, "cka", lambda self: (torch.eye(2), torch.eye(2)))
        found = representations.layer_cka(networks, torch.zeros(6, 1, 8, 8, device="meta"), lambda x: x.float())
    assert devices and set(devices) == {"meta"} and found["layers"]


# ------------------------------------------------------------------ torchrun on GPUs, through fakes

class _Recorder:
    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.result


def test_torchrun_on_gpus_sets_the_local_device_and_joins_nccl_with_a_bounded_timeout(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed, "_RANKS", distributed.Ranks())
    monkeypatch.setitem(distributed._WAITS, "group", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    set_device, init, new_group = _Recorder(), _Recorder(), _Recorder("the waiting group")
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", init)
    monkeypatch.setattr(torch.distributed, "new_group", new_group)
    ranks, device = distributed.start("auto")
    assert (ranks.rank, ranks.world_size, ranks.local_rank) == (3, 4, 1) and device == torch.device("cuda", 1)
    assert set_device.calls == [((torch.device("cuda", 1),), {})]
    assert init.calls == [(("nccl",), {"timeout": timedelta(minutes=30), "device_id": torch.device("cuda", 1)})]
    assert new_group.calls == [((), {"backend": "gloo", "timeout": timedelta(days=7)})]
    assert distributed._WAITS["group"] == "the waiting group"


def test_torchrun_with_more_processes_than_gpus_is_one_clear_error(monkeypatch):
    from ensdiag.errors import EnsdiagError
    for name, value in (("RANK", "2"), ("WORLD_SIZE", "3"), ("LOCAL_RANK", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(distributed, "_RANKS", distributed.Ranks())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(EnsdiagError, match="LOCAL_RANK 2 but this node has 2 CUDA devices"):
        distributed.start("cuda")


def test_ddp_on_cuda_uses_torchs_sync_batchnorm_and_broadcasts_no_buffers(monkeypatch):
    """The arguments DistributedDataParallel and torch's SyncBatchNorm function would get on a GPU."""
    ddp = _Recorder()
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", ddp)
    model = _model("resnet18", "batch-ensemble")
    parallel = distributed.DataParallel(model, torch.device("cuda", 1))
    (_, kwargs), = ddp.calls
    assert kwargs == {"device_ids": [torch.device("cuda", 1)], **distributed.no_buffer_sync()}
    assert set(distributed.no_buffer_sync().values()) == {False}
    assert parallel.norm_forward is distributed._cuda_synced_batchnorm_forward

    from torch.nn.modules import _functions
    assert list(inspect.signature(_functions.SyncBatchNorm.forward).parameters) == [
        "self", "input", "weight", "bias", "running_mean", "running_var", "eps", "momentum", "process_group", "world_size"]
    sync = _Recorder()
    monkeypatch.setattr(_functions.SyncBatchNorm, "apply", sync)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 4)
    norm = torch.nn.BatchNorm2d(3).train()
    x = torch.randn(2, 3, 4, 4, dtype=torch.bfloat16)
    distributed._cuda_synced_batchnorm_forward(norm, x)
    (args, kwargs), = sync.calls
    assert args[0] is x and args[1] is norm.weight and args[2] is norm.bias
    assert args[3] is norm.running_mean and args[4] is norm.running_var
    assert args[5:7] == (norm.eps, 0.1) and args[7] is torch.distributed.group.WORLD and args[8] == 4
    assert int(norm.num_batches_tracked) == 1


@pytest.mark.parametrize("arch, method", [(arch, method) for arch in SHAPES for method in METHODS])
def test_every_buffer_is_batchnorm_statistics_or_a_stored_member_which_ddp_need_not_broadcast(arch, method):
    """broadcast_buffers=False is right only while every buffer is a BatchNorm statistic that the
    synchronised BatchNorm keeps equal on every rank: a method that adds another buffer fails here."""
    from ensdiag.nn.kits.snapshot_ensemble import _Snapshots
    model = _model(arch, method)
    owners = {f"{name}.{buffer}" for name, module in model.named_modules()
              if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for buffer, _ in module.named_buffers(recurse=False)}
    # a procedural ensemble's stored members: copies each rank takes of weights DDP keeps equal, at the same epoch
    copies = {f"{name}.{buffer}" for name, module in model.named_modules() if isinstance(module, _Snapshots)
              for buffer, _ in module.named_buffers(recurse=False) if buffer.startswith("snapshot_") or buffer == "captured"}
    assert {name for name, _ in model.named_buffers()} <= owners | copies


@pytest.fixture
def one_rank_group(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_portable_synced_batchnorm_in_bf16_matches_batchnorm_in_fp32(one_rank_group):
    """The synchronised BatchNorm under bf16 (as --ddp trains on gloo): fp32 statistics, output in
    bf16, running statistics and gradients as a plain BatchNorm's on the fp32 input."""
    x = torch.randn(6, 4, 5, 5) * 3 + 1
    plain, synced = torch.nn.BatchNorm2d(4).train(), torch.nn.BatchNorm2d(4).train()
    wide = x.clone().requires_grad_()
    narrow = x.to(torch.bfloat16).requires_grad_()
    expected = plain(wide)
    out = distributed._synced_batchnorm_forward(synced, narrow)
    assert out.dtype == torch.bfloat16 and synced.running_var.dtype == torch.float32
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)
    torch.testing.assert_close(synced.running_mean, plain.running_mean, rtol=0.01, atol=1e-3)
    torch.testing.assert_close(synced.running_var, plain.running_var, rtol=0.01, atol=1e-3)
    (out.float() * expected.detach()).sum().backward()
    (expected * expected.detach()).sum().backward()
    torch.testing.assert_close(narrow.grad.float(), wide.grad, rtol=0.05, atol=0.05)


# ------------------------------------------------------------------ random states and resume across devices

class _CudaShapedGenerator:
    """A stand-in for a CUDA generator: its state is a seed and an offset (16 bytes)."""

    def __init__(self):
        self.seeded = None

    def get_state(self):
        return torch.zeros(16, dtype=torch.uint8)

    def set_state(self, state):
        raise AssertionError("a CPU generator's state must not be set on a CUDA generator")

    def manual_seed(self, seed):
        self.seeded = seed


def test_a_cuda_run_saves_and_restores_its_own_gpus_random_state(monkeypatch):
    saved_state = torch.arange(16, dtype=torch.uint8)
    get, put = _Recorder(saved_state), _Recorder()
    monkeypatch.setattr(torch.cuda, "get_rng_state", get)
    monkeypatch.setattr(torch.cuda, "set_rng_state", put)
    generator, device = torch.Generator().manual_seed(1), torch.device("cuda", 1)
    state = _rng_state(generator, device)
    assert get.calls == [((device,), {})] and state["cuda_device"] is saved_state
    assert _restore_rng(state, torch.Generator(), device, reseed=5) == []
    assert put.calls == [((saved_state, device), {})]


def test_a_cpu_state_resumed_on_cuda_reseeds_what_cannot_carry_over(monkeypatch):
    seeded = _Recorder()
    monkeypatch.setattr(torch.cuda, "manual_seed", seeded)
    state = _rng_state(torch.Generator().manual_seed(1), torch.device("cpu"))
    generator = _CudaShapedGenerator()
    lost = _restore_rng(state, generator, torch.device("cuda", 0), reseed=1234)
    assert lost == ["the data order", "the dropout masks"]
    assert generator.seeded == 1234 and seeded.calls == [((1234,), {})]


def test_device_cuda_without_a_gpu_is_one_line(capsys, tmp_path):
    from .cli import assert_one_line_error
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_one_line_error(capsys, "train", "--device", "cuda", "--out", tmp_path / "run", "--epochs", "1",
                          match="--device cuda asked for, but torch sees no CUDA device")
    assert not (tmp_path / "run").exists()


def test_cuda_graph_modes_report_whether_cuda_graphs_ran(tmp_path, capsys):
    """torch.compile on the CPU (inductor, as on CUDA): reduce-overhead asks for CUDA graphs,
    inductor skips them here, and the bench JSON says so instead of labelling the timing CUDA graphs."""
    import json

    from .cli import run_cli
    code, out, err = run_cli(capsys, "bench", "--method", "single", "--compile-mode", "reduce-overhead", "--no-reference",
                             "--train-size", 64, "--test-size", 16, "--epochs", 1, "--format", "json",
                             "--results-dir", tmp_path)
    assert code == 0, err
    compiled = json.loads(out)["methods"]["single"]["compiled"]
    assert compiled["mode"] == "reduce-overhead" and compiled["graphs"] >= 1
    assert compiled["cuda_graphs"].startswith("skipped in ")


def test_compile_report_names_what_ran():
    from ensdiag.bench.harness import compile_report
    zero = {"graphs": 0, "graph_breaks": 0, "cuda_graph_skips": 0}
    assert compile_report("default", zero, {**zero, "graphs": 2})["cuda_graphs"] == "not asked"
    assert compile_report("max-autotune", zero, {**zero, "graphs": 2})["cuda_graphs"] == "used"
    skipped = compile_report("reduce-overhead", zero, {"graphs": 2, "graph_breaks": 1, "cuda_graph_skips": 2})
    assert skipped == {"mode": "reduce-overhead", "graphs": 2, "graph_breaks": 1,
                       "cuda_graphs": "skipped in 2 compiled graph(s): timed as plain compiled code"}


# ------------------------------------------------------------------ precision end to end

@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """`train --precision bf16` on the CPU: the arithmetic `train` uses on CUDA by default."""
    from ensdiag.experiment import run_experiment
    out = tmp_path_factory.mktemp("bf16") / "run"
    config = preset_config("digits", methods=["deep-ensemble", "batch-ensemble"], seeds=[1], epochs=3, members=2,
                           precision="bf16", geometry=False)
    run_experiment(config, out, "data", quiet=True)
    return out


def test_bf16_training_is_recorded_and_its_predictions_are_exact_fp32(bf16_run):
    import json

    from safetensors.torch import load_file

    from ensdiag.checkpoint import load_model
    for method in ("deep-ensemble", "batch-ensemble"):
        run = bf16_run / method / "seed-1"
        meta = json.loads((run / "meta.json").read_text())
        assert meta["precision"] == {"train": "bf16 autocast", "asked": "bf16", "train_tf32": False,
                                     "cudnn_benchmark": False, "predict": "fp32 (no TF32)"}
        assert json.loads((bf16_run / "experiment.json").read_text())["config"]["precision"] == "bf16"
        stored = load_file(run / "predictions.safetensors")["id/logits"]
        again = _evaluated(load_model(run / "model.safetensors"))
        torch.testing.assert_close(stored, again["id"]["logits"], rtol=0, atol=0)


def _evaluated(model):
    """The predictions `ensdiag evaluate` makes of a model on the digits preset's data."""
    from ensdiag.core import Measure, inspect
    from ensdiag.core.inputs import prepare
    inputs = prepare(model, "digits", "data", device="cpu")
    return inspect(model, inputs.splits, preprocess=inputs.preprocess, measure=Measure(geometry=False, only=())).predictions


def test_bf16_and_fp32_predictions_of_one_model_give_metrics_within_the_stated_tolerance(bf16_run, monkeypatch):
    """What ensdiag no longer does, measured: predicting under bf16 autocast moves NLL and ECE by
    about 1e-4 and JSD by a few per cent on digits (docs/gpu.md states these tolerances), which
    is why every prediction is fp32."""
    from ensdiag.core import predict as predict_module
    from ensdiag.analysis import analyze_predictions
    from ensdiag.checkpoint import load_model
    model = load_model(bf16_run / "batch-ensemble" / "seed-1" / "model.safetensors")
    exact = _evaluated(model)
    monkeypatch.setattr(predict_module, "exact_math", lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    rounded = _evaluated(model)
    assert not torch.equal(exact["id"]["logits"], rounded["id"]["logits"])  # bf16 did change the logits
    a, b = (analyze_predictions(p, only=["calibration", "uncertainty", "disagreement"])["analyzers"] for p in (exact, rounded))
    value = lambda result, analyzer, key: result[analyzer]["splits"]["id"][key]["value"]  # noqa: E731
    assert abs(value(a, "calibration", "accuracy") - value(b, "calibration", "accuracy")) <= 0.005
    assert abs(value(a, "calibration", "nll") - value(b, "calibration", "nll")) <= 2e-3
    assert abs(value(a, "calibration", "ece") - value(b, "calibration", "ece")) <= 2e-3
    assert value(b, "uncertainty", "jsd") == pytest.approx(value(a, "uncertainty", "jsd"), rel=0.1)
    assert abs(value(a, "disagreement", "mean") - value(b, "disagreement", "mean")) <= 0.01


def test_a_state_saved_on_cuda_resumes_on_the_cpu_and_says_what_was_reseeded(tmp_path):
    """A CUDA run's state: its data-order generator is a seed and an offset (16 bytes), which the
    CPU's generator cannot take; the run resumes, seeded afresh, with one line naming both devices."""
    from ensdiag.train import fit
    from .test_train import digits_fit_data, small
    state = tmp_path / "state.pt"
    fit(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)), small(epochs=1, early_stopping=False),
        digits_fit_data(64), 1, state, "cpu")
    saved = torch.load(state, weights_only=True)
    saved["rng"]["generator"] = torch.zeros(16, dtype=torch.uint8)  # as torch.Generator("cuda").get_state()
    saved["rng"]["cuda_device"] = torch.zeros(16, dtype=torch.uint8)
    saved["device"] = "cuda:0"
    torch.save(saved, state)
    notes = []
    result = fit(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)), small(epochs=3, early_stopping=False),
                 digits_fit_data(64), 1, state, "cpu", on_note=notes.append)
    assert [row["epoch"] for row in result["history"]] == [1, 2, 3]
    assert len(notes) == 1 and "saved on cuda:0 and resumes on cpu" in notes[0] and "the data order" in notes[0]
    assert "damaged" not in notes[0]


@pytest.mark.parametrize("run", ["single", "deep-ensemble", "batch-ensemble"])
def test_reference_pipeline_trains_with_fp16_autocast_and_its_grad_scaler(run):
    """The bench's reference pipeline on CUDA: fp16 autocast with a GradScaler (CPU autocast and
    GradScaler run the same code), loss finite, weights updated and kept fp32."""
    from ensdiag.bench.reference import ReferenceModel, make_loader
    config = preset_config("digits", methods=[run], members=2, batch_size=8)
    reference = ReferenceModel(config, run, torch.device("cpu"), amp=True)
    assert reference.scaler.is_enabled()
    data = _fit_data("mlp", n=16)
    before = [p.detach().clone() for network in reference.networks for p in network.parameters()]
    loader = make_loader(data.train_images, data.train_labels, config, 8, True, 0, torch.device("cpu"))
    loss, accuracy = reference.train_epoch(loader)
    after = [p for network in reference.networks for p in network.parameters()]
    assert torch.isfinite(torch.tensor(loss)) and 0 <= accuracy <= 1
    assert all(p.dtype == torch.float32 for p in after) and any(not torch.equal(a, b) for a, b in zip(before, after))
    logits = reference.predict(make_loader(data.train_images, data.train_labels, config, 8, False, 0, torch.device("cpu")))
    assert logits.dtype == torch.float32 and logits.shape[1] == 16


def test_vmap_members_of_a_batchnorm_network_on_cuda_are_refused_in_one_line_and_skipped_by_the_bench():
    """torch's CUDA batch_norm cannot run inside vmap (seen on an H200): the strategy says so
    instead of an internal error, and `bench --strategies` skips it with the reason."""
    from ensdiag.nn.members import forward_vmap, unsupported
    assert unsupported("vmap", "cuda", "resnet18") and unsupported("vmap", "cpu", "resnet18") is None
    assert unsupported("vmap", "cuda", "mlp") is None and unsupported("loop", "cuda", "resnet18") is None
    model = _model("resnet18", "deep-ensemble", strategy="vmap")

    class OnCuda(torch.Tensor):  # the device check only: nothing runs on a GPU
        @property
        def device(self):
            return torch.device("cuda", 0)

    xs = torch.randn(model.num_members, 2, 3, 8, 8).as_subclass(OnCuda)
    with pytest.raises(ValueError, match="member_strategy 'vmap' cannot run resnet18 on cuda"):
        forward_vmap(model, xs)
