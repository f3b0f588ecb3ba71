import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI: waiting threads sleep (before torch loads)
import torch  # noqa: E402

from ensdiag.threads import cpus  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers share the cores the run may use (pytest -n), as the CLI would
    _threads = str(max(1, cpus() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = _threads  # and the processes the tests start
    torch.set_num_threads(int(_threads))


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global RNG state, so failures reproduce, and leaves the
    process-wide denormal flushing (turned on by training and prediction) as it found it."""
    torch.manual_seed(0)
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Decompressed dataset copies go to a per-session folder, not the user's cache."""
    monkeypatch.setenv("ENSDIAG_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A tiny finished run: single and BatchEnsemble, one seed, two epochs on the embedded digits;
    trained once for the whole test run, so tests read it and damage only copies (`run`)."""
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    out = tmp_path_factory.mktemp("finished") / "run"
    config = preset_config("digits", methods=["single", "batch-ensemble"], seeds=[1], epochs=2, members=2,
                           detail=True)  # (the detail catalogue too: tests read it)
    run_experiment(config, out, "data", quiet=True)
    return out


@pytest.fixture
def run(finished_run, tmp_path):
    """A copy of `finished_run` to damage; `box` holds only the run: nothing else may appear in it."""
    import shutil
    copy = tmp_path / "box" / "run"
    shutil.copytree(finished_run, copy)
    return copy
