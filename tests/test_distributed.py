"""torchrun on the CPU (gloo, 2 processes): the grid over ranks gives the single-process numbers,
--ddp the single-process weights, and a job with a killed rank finishes on restart with
nothing lost and nothing trained twice. Plus the pieces: run assignment, sharding, BatchNorm
synchronised over ranks."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ensdiag.distributed import Ranks, shard
from ensdiag.experiment import assign_runs

TORCHRUN = shutil.which("torchrun")
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")
GRID = ["--method", "single,mc-dropout,deep-ensemble,batch-ensemble", "--seeds", "1,2", "--epochs", "2", "--quiet"]
# One thread per process in both: float sums then add up in the same order in every process.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def torchrun(*args, cwd, nproc=2, **kwargs):
    command = [TORCHRUN, "--nproc-per-node", str(nproc), "--standalone", "-m", "ensdiag", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600, **kwargs)


def single_process(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ensdiag", *map(str, args)], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=600)


def numbers(run_dir: Path) -> dict:
    """Every run's metrics with the timing fields left out."""
    def strip(node):
        if isinstance(node, dict):
            return {key: strip(value) for key, value in node.items() if key not in ("seconds",)}
        if isinstance(node, list):
            return [strip(value) for value in node]
        return node
    return {str(path.relative_to(run_dir)): strip(json.loads(path.read_text())) for path in sorted(run_dir.glob("*/seed-*/metrics.json"))}


# ---------------------------------------------------------------- pieces


def test_runs_are_spread_longest_first_and_each_to_one_rank():
    runs = [(run, seed) for run in ("single", "mc-dropout", "deep-ensemble", "batch-ensemble") for seed in (1, 2, 3)]
    costs = {"single": 1, "mc-dropout": 1, "deep-ensemble": 4, "batch-ensemble": 4}
    owner = assign_runs(runs, costs, 4)
    assert sorted(owner) == sorted(runs)  # every run, once
    expensive = [owner[run, seed] for run in ("deep-ensemble", "batch-ensemble") for seed in (1, 2, 3)]
    assert sorted(expensive) == [0, 0, 1, 1, 2, 3]  # the six expensive runs on all four ranks, two at most on one
    load = [sum(costs[run] for (run, _), rank in owner.items() if rank == r) for r in range(4)]
    assert max(load) - min(load) <= 1
    assert assign_runs(runs, costs, 1) == {run: 0 for run in runs}


@pytest.mark.parametrize("n,world", [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_shards_cover_every_item_once_in_order(n, world):
    parts = [shard(n, Ranks(rank, world)) for rank in range(world)]
    assert [i for part in parts for i in range(n)[part]] == list(range(n))
    assert max(len(range(n)[p]) for p in parts) - min(len(range(n)[p]) for p in parts) <= 1


def _synced_batchnorm_worker(rank, path, x, weight_grad_out):
    import torch.distributed as dist
    from ensdiag import distributed
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    torch.manual_seed(0)
    norm = torch.nn.BatchNorm2d(3)
    norm.weight.data.uniform_(0.5, 1.5)
    module = torch.nn.Module()
    module.norm = norm
    part = x[:5] if rank == 0 else x[5:]  # unequal shares: 5 and 4 images
    local = part.clone().requires_grad_(True)
    parallel = distributed.DataParallel.__new__(distributed.DataParallel)
    parallel.norms, parallel.norm_forward = [norm], distributed.synced_batchnorm_forward("cpu")
    with parallel:
        out = norm(local)
    loss = (out.square() * (1 + torch.arange(3).view(1, 3, 1, 1))).sum()
    loss.backward()
    dist.all_reduce(norm.weight.grad)
    torch.save({"out": out.detach(), "grad": local.grad, "weight_grad": norm.weight.grad, "mean": norm.running_mean,
                "var": norm.running_var}, weight_grad_out.format(rank))
    dist.destroy_process_group()


@pytest.mark.slow  # process groups
def test_batchnorm_synchronised_over_ranks_is_batchnorm_on_the_whole_batch(tmp_path):
    x = torch.randn(9, 3, 4, 4) * 2 + 1
    out_file = str(tmp_path / "rank{}.pt")
    torch.multiprocessing.spawn(_synced_batchnorm_worker, args=(str(tmp_path / "store"), x, out_file), nprocs=2)
    torch.manual_seed(0)
    norm = torch.nn.BatchNorm2d(3)
    norm.weight.data.uniform_(0.5, 1.5)
    whole = x.clone().requires_grad_(True)
    out = norm(whole)
    (out.square() * (1 + torch.arange(3).view(1, 3, 1, 1))).sum().backward()
    ranks = [torch.load(out_file.format(r)) for r in range(2)]
    torch.testing.assert_close(torch.cat([r["out"] for r in ranks]), out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([r["grad"] for r in ranks]), whole.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ranks[0]["weight_grad"], norm.weight.grad, rtol=1e-4, atol=1e-4)
    for r in ranks:
        torch.testing.assert_close(r["mean"], norm.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["var"], norm.running_var, rtol=1e-5, atol=1e-6)


def _one_epoch(arch, parallel_ranks=None, store=None, out=None):
    """One epoch of a Deep Ensemble on 14 images in batches of 9 (9 + 5: shares 5/4 and 3/2 over
    two ranks): the weights, and the batch sizes this process's forward saw."""
    from ensdiag import distributed
    from ensdiag.config import preset_config
    from ensdiag.data.batching import Normalize
    from ensdiag.nn import build_model
    from ensdiag.train import FitData, make_optimizer, train_epoch
    if parallel_ranks is not None:
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=parallel_ranks, world_size=2)
        distributed._RANKS = distributed.Ranks(parallel_ranks, 2, parallel_ranks)
    shape, options = ((1, 8, 8), {}) if arch == "mlp" else ((3, 8, 8), {"width": 2})
    config = preset_config("digits", batch_size=9, members=2)
    generator = torch.Generator().manual_seed(0)
    images, labels = torch.rand(14, *shape, generator=generator), torch.randint(0, 10, (14,), generator=generator)
    torch.manual_seed(0)
    model = build_model(arch, "deep-ensemble", 2, 10, shape, arch_options=options)
    data = FitData(images, labels, images[:0], labels[:0], Normalize((0.5,) * shape[0], (0.25,) * shape[0], torch.device("cpu")))
    optimizer, _ = make_optimizer(model, config)
    seen = []
    parallel = distributed.DataParallel(model, torch.device("cpu")) if parallel_ranks is not None else None
    forward = model.forward_members
    model.forward_members = lambda xs: (seen.append(xs.shape[1]), forward(xs))[1]
    orders = torch.stack([torch.randperm(14, generator=torch.Generator().manual_seed(m)) for m in range(2)])
    with parallel or _Nothing():
        loss, _ = train_epoch(model, optimizer, data, orders, config, torch.Generator().manual_seed(1), parallel=parallel)
    from ensdiag.data.registry import Split
    from ensdiag.core.predict import predict
    seen_then, seen[:] = list(seen), []
    logits = predict(model, {"id": Split(images, labels)}, data.normalize, torch.device("cpu"),
                     spread=parallel_ranks is not None)["id"]["logits"]
    result = {"state": {k: v.clone() for k, v in model.state_dict().items()}, "seen": seen_then, "loss": loss,
              "predicted": list(seen), "logits": logits}
    if parallel_ranks is None:
        return result
    torch.save(result, out.format(parallel_ranks))
    distributed.finish()  # every group, the waiting one included
    distributed._RANKS = distributed.Ranks()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _one_epoch_worker(rank, arch, store, out):
    _one_epoch(arch, rank, store, out)
    # A spawned worker whose result is saved ends here, without the interpreter's teardown: gloo's
    # threads destroyed in the wrong order at exit once aborted a worker ("terminate called without
    # an active exception", SIGABRT) after its work was done and checked.
    import os
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow  # process groups
@pytest.mark.parametrize("arch", ["mlp", "resnet18"])
def test_ddp_steps_train_each_ranks_share_to_one_process_weights(arch, tmp_path):
    """Each rank's forward sees only its share (uneven: 5/4, then 3/2), and the weights after the
    epoch — BatchNorm statistics synchronised inside DDP for the ResNet — are one process's."""
    out = str(tmp_path / "rank{}.pt")
    torch.multiprocessing.spawn(_one_epoch_worker, args=(arch, str(tmp_path / "store"), out), nprocs=2)
    alone = _one_epoch(arch)
    ranks = [torch.load(out.format(r)) for r in range(2)]
    assert alone["seen"] == [9, 5] and ranks[0]["seen"] == [5, 3] and ranks[1]["seen"] == [4, 2]
    # evaluation spread over the ranks: each predicts its half, and both get every logit, in order
    assert alone["predicted"] == [14] and ranks[0]["predicted"] == [7] and ranks[1]["predicted"] == [7]
    for rank in ranks:
        torch.testing.assert_close(rank["logits"], ranks[0]["logits"], rtol=0, atol=0)
    for rank in ranks:
        assert rank["loss"] == pytest.approx(alone["loss"], rel=1e-5)
        torch.testing.assert_close(rank["logits"], alone["logits"], rtol=1e-4, atol=1e-5)
        # gradients summed in two shares (and threads' reduction order): float rounding, far below the
        # factor-of-a-share error a wrongly weighted loss would give
        for key, value in alone["state"].items():
            torch.testing.assert_close(rank["state"][key], value, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- torchrun end to end


@pytest.fixture(scope="module")
def single_grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    done = single_process("train", "--out", root / "run", *GRID, cwd=root)
    assert done.returncode == 0, done.stderr
    return root / "run"


@needs_torchrun
@pytest.mark.slow
def test_the_grid_over_two_ranks_gives_the_single_process_numbers(single_grid, tmp_path):
    done = torchrun("train", "--out", tmp_path / "run", *GRID, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp_path / "run"
    assert numbers(run) == numbers(single_grid)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in single_grid.iterdir())  # the report too
    assert {"figures", "report.md", "report.html", "report-cache.json"} <= {p.name for p in run.iterdir()}  # (by rank 0)
    trained_by = {}
    for meta in run.glob("*/seed-*/meta.json"):
        data = json.loads(meta.read_text())
        assert data["world_size"] == 2 and data["rank"] in (0, 1)
        trained_by.setdefault(data["rank"], []).append(data["run"])
    assert sorted(trained_by) == [0, 1]
    for rank, methods in trained_by.items():  # the expensive methods spread: one seed of each on each rank
        assert sorted(m for m in methods if m in ("deep-ensemble", "batch-ensemble")) == ["batch-ensemble", "deep-ensemble"]


@needs_torchrun
@pytest.mark.slow
def test_ddp_over_two_ranks_gives_the_single_process_weights(single_grid, tmp_path):
    from safetensors.torch import load_file
    done = torchrun("train", "--out", tmp_path / "run", "--method", "single,deep-ensemble,batch-ensemble", "--seeds", "1",
                    *GRID[4:], "--ddp", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for method in ("single", "deep-ensemble", "batch-ensemble"):
        for seed in (1,):
            ours = load_file(tmp_path / "run" / method / f"seed-{seed}" / "model.safetensors")
            theirs = load_file(single_grid / method / f"seed-{seed}" / "model.safetensors")
            for key in theirs:
                torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-5)
            meta = json.loads((tmp_path / "run" / method / f"seed-{seed}" / "meta.json").read_text())
            assert meta["ddp"] is True and meta["world_size"] == 2 and "rank" not in meta


def _worker_pids(parent: int) -> list[int]:
    """The processes torchrun started (children of its agent), by their RANK."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            ppid = int(next(line for line in status.splitlines() if line.startswith("PPid:")).split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, StopIteration, ValueError):
            continue
        if ppid == parent:
            rank = next((item.split(b"=", 1)[1] for item in environ if item.startswith(b"RANK=")), None)
            if rank is not None:
                found[int(rank)] = int(entry.name)
    return [found[rank] for rank in sorted(found)]


@needs_torchrun
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
def test_a_killed_rank_is_resumed_with_nothing_lost_and_nothing_trained_twice(single_grid, tmp_path):
    run = tmp_path / "run"
    grid = ["--method", "single,deep-ensemble", "--seeds", "1,2", "--epochs", "30", "--no-early-stopping", "--quiet"]
    command = [TORCHRUN, "--nproc-per-node", "2", "--standalone", "-m", "ensdiag", "train", "--out", str(run), *grid]
    job = subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # wait until a run has finished and another is mid-training
            finished = list(run.glob("*/seed-*/meta.json"))
            training = list(run.glob("*/seed-*/training-state.pt"))
            if finished and training:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the job never reached a finished run and one in progress")
        victim = _worker_pids(job.pid)[1]
        os.kill(victim, signal.SIGKILL)
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    kept = {meta: meta.read_bytes() for meta in run.glob("*/seed-*/meta.json")}
    assert kept
    done = torchrun("train", "--out", run, *grid, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(meta.read_bytes() == content for meta, content in kept.items())  # finished runs untouched
    for history in run.glob("*/seed-*/history.jsonl"):  # every run's epochs once each, in order
        assert [json.loads(line)["epoch"] for line in history.read_text().splitlines()] == list(range(1, 31))
    assert len(list(run.glob("*/seed-*/meta.json"))) == 4 and not list(run.glob("*/seed-*/training-state.pt"))


@needs_torchrun
@pytest.mark.slow
def test_evaluation_spread_over_ranks_is_gathered_in_order(single_grid, tmp_path):
    from safetensors.torch import load_file
    model = single_grid / "batch-ensemble" / "seed-1" / "model.safetensors"
    done = torchrun("evaluate", model, "--out", tmp_path / "two", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count('"schema"') == 1  # rank 0 alone reports
    alone = single_process("evaluate", model, "--out", tmp_path / "one", "--format", "json", cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr
    two, one = load_file(tmp_path / "two" / "predictions.safetensors"), load_file(tmp_path / "one" / "predictions.safetensors")
    assert two.keys() == one.keys() and all(torch.equal(two[key], one[key]) for key in one)
    assert json.loads(done.stdout)["analyzers"] == json.loads(alone.stdout)["analyzers"]
