"""Threads that fit the machine (ensdiag/threads.py): the CPUs a process may use, the CLI's choice,
a user's explicit setting winning and recorded, and the Python API leaving the caller's count alone."""

import json
import subprocess
import sys

import pytest
import torch

from ensdiag import threads
from ensdiag.entry import main as entry_main

from .cli import run_cli


def _cgroup(tmp_path, line: str, files: dict) -> tuple:
    """(root, /proc/self/cgroup) of a fake cgroup tree: `files` maps paths below the root to contents."""
    for name, text in files.items():
        path = tmp_path / "fs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    (tmp_path / "self").write_text(line + "\n")
    return tmp_path / "fs", tmp_path / "self"


@pytest.mark.parametrize("text, quota", [("max 100000\n", None), ("150000 100000\n", 1.5), ("50000 100000", 0.5),
                                         ("400000 100000", 4.0), ("garbage", None), ("", None), ("-1 100000", None),
                                         ("0 100000", None), ("1 2 3", None), ("100000 0", None), (b"\xff\xfe 1", None)])
def test_a_cgroup_v2_quota_is_read_and_odd_files_are_no_quota(tmp_path, text, quota):
    root, own = _cgroup(tmp_path, "0::/", {"cpu.max": text})
    assert threads.cgroup_quota(root, own) == quota


def test_the_tightest_quota_on_the_way_up_counts_v2_and_v1(tmp_path):
    root, own = _cgroup(tmp_path / "v2", "0::/batch/job", {"cpu.max": "max 100000", "batch/cpu.max": "250000 100000",
                                                           "batch/job/cpu.max": "max 100000"})
    assert threads.cgroup_quota(root, own) == 2.5
    root, own = _cgroup(tmp_path / "v1", "5:cpuacct,cpu:/docker/abc\n4:memory:/docker/abc",
                        {"cpuacct,cpu/docker/abc/cpu.cfs_quota_us": "150000\n", "cpuacct,cpu/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert threads.cgroup_quota(root, own) == 1.5
    root, own = _cgroup(tmp_path / "v1-unlimited", "4:cpu:/", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert threads.cgroup_quota(root, own) is None
    root, own = _cgroup(tmp_path / "v1-no-period", "4:cpu:/", {"cpu/cpu.cfs_quota_us": "50000"})
    assert threads.cgroup_quota(root, own) is None
    assert threads.cgroup_quota(tmp_path / "nowhere", tmp_path / "no-such-file") is None


@pytest.mark.parametrize("text, expected", [("max 100000", 8), ("150000 100000", 1), ("50000 100000", 1),
                                            ("400000 100000", 4), ("1600000 100000", 8), ("garbage", 8)])
def test_the_cpus_are_the_affinity_within_the_quota_in_whole_cpus(tmp_path, monkeypatch, text, expected):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    root, own = _cgroup(tmp_path, "0::/", {"cpu.max": text})
    assert threads.cpus(root, own) == expected


def _meta(folder) -> dict:
    return json.loads((folder / "single" / "seed-1" / "meta.json").read_text())["environment"]


@pytest.mark.parametrize("flag, omp, expected", [(["--threads", "2"], "3", (2, "--threads")), ([], "3", (3, "OMP_NUM_THREADS")),
                                                 ([], None, (1, "ensdiag")), ([], "0", (1, "ensdiag"))])
def test_the_cli_computes_with_an_explicit_setting_else_its_choice_records_it_and_gives_the_count_back(
        tmp_path, capsys, monkeypatch, flag, omp, expected):
    """--threads beats OMP_NUM_THREADS, which beats ensdiag's choice (one thread for the digits MLP; "0"
    is no setting); meta.json says which, and the command in-process leaves the process's count as it was."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if omp is not None:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    before = torch.get_num_threads()
    code, _, err = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--quiet",
                           "--out", tmp_path / "run", *flag)
    assert code == 0, err
    environment = _meta(tmp_path / "run")
    assert (environment["threads"], environment["threads_from"]) == expected
    assert torch.get_num_threads() == before and threads.origin() == "caller"


def test_the_console_script_waits_passively_unless_the_user_said_otherwise(tmp_path, monkeypatch):
    loaded = subprocess.run([sys.executable, "-c", "import sys, ensdiag.entry; print('torch' in sys.modules)"],
                            capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip() == "False"  # OMP_WAIT_POLICY is set before torch (and its OpenMP) loads
    for given, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        if given:
            monkeypatch.setenv("OMP_WAIT_POLICY", given)
        entry_main(["train", "--method", "single", "--seeds", "1", "--epochs", "1", "--quiet", "--no-geometry",
                    "--out", str(tmp_path / expected)])
        assert _meta(tmp_path / expected)["omp_wait_policy"] == expected


def test_the_python_api_computes_with_the_callers_threads_and_gives_them_back(tmp_path):
    """Training through the API and `ensdiag.diagnose` use the count the caller set (recorded as the
    caller's) and leave it as it was, even after a CLI command ran in the same process."""
    import ensdiag
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        run_experiment(preset_config("digits", methods=["single"], seeds=[1], epochs=1, geometry=False),
                       tmp_path / "run", "data", quiet=True)
        assert (_meta(tmp_path / "run")["threads"], _meta(tmp_path / "run")["threads_from"]) == (3, "caller")
        members = [torch.nn.Linear(4, 3) for _ in range(2)]
        ensdiag.diagnose(members, test=(torch.randn(64, 4), torch.randint(0, 3, (64,))))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_report_read_back_with_threads_given_loads_no_torch(run):
    """`report --threads N` sets the count once the report is built; one read back needs no torch at all."""
    from ensdiag.report import make_report
    make_report(run)  # kept beside the run (report/cached.py)
    script = ("import sys\nclass Refuse:\n    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'torch' or name.startswith('torch.'):\n            raise ImportError('torch imported')\n"
              "sys.meta_path.insert(0, Refuse())\nfrom ensdiag.cli import main\n"
              "main(['report', sys.argv[1], '--format', 'summary', '--threads', '2'])\n")
    done = subprocess.run([sys.executable, "-c", script, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "single" in done.stdout, done.stderr[-2000:]


def test_analyze_and_a_report_built_compute_with_the_threads_given(run, tmp_path, capsys, monkeypatch):
    """--threads reaches the torch work of `analyze` and of a report built afresh, and is given back after."""
    import numpy as np
    np.save(tmp_path / "p.npy", np.random.default_rng(0).normal(size=(3, 40, 4)).astype("float32"))
    np.save(tmp_path / "l.npy", np.random.default_rng(1).integers(0, 4, 40))
    before, calls = torch.get_num_threads(), []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda count: calls.append(count) or real(count))
    for command in (["analyze", tmp_path / "p.npy", "--labels", tmp_path / "l.npy"], ["report", run, "--no-figures"]):
        calls.clear()
        code, _, err = run_cli(capsys, *command, "--format", "json", "--threads", "3")
        assert code == 0, err
        assert set(calls[:-1]) == {3} and calls[-1] == before and torch.get_num_threads() == before
