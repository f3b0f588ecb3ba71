"""The report kept beside a run (report/cached.py): read back, without torch, only where it was built
from the very files, options and code of now and signed with this user's key, and then it renders
exactly as a report built afresh; `ensdiag train` writes it as its last step."""

import json
import os
import subprocess
import sys

import pytest

from ensdiag.io import atomic_write_json
from ensdiag.report import aggregate, make_report, render
from ensdiag.report import cached as C

from .cli import run_cli
from .test_report import run_dir  # noqa: F401 (the fixture)

FORMATS = ("markdown", "json", "latex", "html", "csv", "summary")
NO_TORCH = """
import json, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch imported")
sys.meta_path.insert(0, Refuse())
from ensdiag.report import make_report, render
report = make_report(sys.argv[1])
written = report.pop("written")
print(json.dumps({fmt: render({**report, "written": written}, fmt, report["run"]) for fmt in %r}))
""" % (FORMATS,)


def rendered(folder, **options) -> dict:
    report = make_report(folder, **options)
    written = report.pop("written")
    return {fmt: render({**report, "written": written}, fmt, report["run"]) for fmt in FORMATS}


@pytest.fixture
def builds(monkeypatch):
    """How many reports were built (not read back) since the test began."""
    counted = []
    real = aggregate.build_report
    monkeypatch.setattr(aggregate, "build_report", lambda *a, **k: counted.append(1) or real(*a, **k))
    return counted


def test_a_report_asked_again_is_read_back_without_torch_and_renders_as_built(run_dir):  # noqa: F811
    built = rendered(run_dir)
    assert (run_dir / C.CACHE_FILE).is_file()
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(run_dir)], capture_output=True, text=True, timeout=120,
                          env=os.environ)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == built  # every format, byte for byte (the figures' paths included)


def test_a_changed_file_option_code_or_figure_builds_the_report_again(run_dir, builds, monkeypatch):  # noqa: F811
    first = make_report(run_dir)
    make_report(run_dir)
    assert len(builds) == 1  # the second read back
    metrics = next(run_dir.glob("deep-ensemble/seed-*/metrics.json"))
    changed = json.loads(metrics.read_text())
    changed["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["value"] = 0.123456
    atomic_write_json(metrics, changed)
    again = make_report(run_dir)
    assert len(builds) == 2 and again != first and "0.123456" in json.dumps(again)
    make_report(run_dir, conventions="torch-uncertainty")
    assert len(builds) == 3
    monkeypatch.setattr(C, "_code_digest", lambda: b"another version of ensdiag")
    make_report(run_dir)
    assert len(builds) == 4
    (run_dir / first["figures"][0]["png"]).unlink()
    make_report(run_dir)
    assert len(builds) == 5 and (run_dir / first["figures"][0]["png"]).is_file()  # drawn again
    monkeypatch.setattr(C, "registered_here", lambda: True)  # an analyzer registered from Python: no cache at all
    (run_dir / C.CACHE_FILE).unlink()
    make_report(run_dir)
    make_report(run_dir)
    assert len(builds) == 7 and not (run_dir / C.CACHE_FILE).exists()


def test_a_cache_this_user_did_not_sign_is_never_believed(run_dir, builds, monkeypatch, tmp_path):  # noqa: F811
    built = rendered(run_dir)
    path = run_dir / C.CACHE_FILE
    signature, _, body = path.read_bytes().partition(b"\n")
    forged = json.loads(body)
    forged["report"]["verdict"] = {"deep-ensemble": {"answer": "forged"}}
    path.write_bytes(signature + b"\n" + json.dumps(forged).encode())  # the old signature, another body
    assert rendered(run_dir) == built and len(builds) == 2
    monkeypatch.setenv("ENSDIAG_CACHE", str(tmp_path / "another user"))  # another key
    assert rendered(run_dir) == built and len(builds) == 3
    for damaged in (b"", b"not a signature\n{}", b"\xff\xfe" * 100, signature + b"\n[1, 2"):
        path.write_bytes(damaged)
        assert rendered(run_dir) == built
    make_report(run_dir)
    (tmp_path / "elsewhere.json").write_bytes(path.read_bytes())  # a valid cache, reached through a link
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    assert rendered(run_dir) == built and len(builds) == 8  # (the make_report above read back)


def test_where_no_key_can_be_kept_nothing_is_cached(run_dir, builds, monkeypatch, tmp_path):  # noqa: F811
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv("ENSDIAG_CACHE", str(blocked))
    built = rendered(run_dir)
    assert rendered(run_dir) == built and len(builds) == 2 and not (run_dir / C.CACHE_FILE).exists()


def test_train_ends_with_the_report_that_report_reads_back(tmp_path, capsys, builds):
    out = tmp_path / "run"
    code, _, _ = run_cli(capsys, "train", "--method", "single,deep-ensemble", "--seeds", "1", "--epochs", "1",
                         "--members", "2", "--no-geometry", "--quiet", "--out", out)
    assert code == 0 and len(builds) == 1
    for name in ("report.md", "report.html", C.CACHE_FILE):
        assert (out / name).is_file()
    assert any((out / "figures").glob("*.png"))
    metrics = json.loads(next(out.glob("deep-ensemble/seed-*/metrics.json")).read_text())["analyzers"]
    assert metrics["temperature"]["status"] == "skipped"  # (a grid without --detail: the catalogue left out, said)
    assert "`ensdiag train --detail` computes it" in " ".join((out / "report.md").read_text().split())
    code, summary, _ = run_cli(capsys, "report", out, "--format", "summary")
    assert code == 0 and "Deep Ensemble" in summary and len(builds) == 1  # read back, not built
    kept = make_report(out)
    fresh = aggregate.build_report(out)
    assert len(builds) == 2
    for key in ("figures", "figures_on_request", "written"):
        kept.pop(key), fresh.pop(key, None)
    assert kept == json.loads(json.dumps(fresh))  # (through JSON: ±inf written and read back)


def test_a_link_the_environment_or_an_odd_file_never_serves_a_stale_report(run_dir, builds, monkeypatch, tmp_path):  # noqa: F811
    make_report(run_dir)
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "3G")  # the budget can change what a report says: built again
    make_report(run_dir)
    assert len(builds) == 2
    (run_dir / "notes-\udcff.txt").write_bytes(b"a file of no UTF-8 name")  # read like any other
    make_report(run_dir)
    make_report(run_dir)
    assert len(builds) == 3
    seed = next(run_dir.glob("deep-ensemble/seed-*"))
    elsewhere = tmp_path / "elsewhere"
    seed.rename(elsewhere)
    seed.symlink_to(elsewhere, target_is_directory=True)  # a seed reached through a link: its files could change unseen
    make_report(run_dir)
    metrics = json.loads((elsewhere / "metrics.json").read_text())
    metrics["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["value"] = 0.123456
    atomic_write_json(elsewhere / "metrics.json", metrics)
    assert "0.123456" in json.dumps(make_report(run_dir)) and len(builds) == 5
    assert not (run_dir / C.CACHE_FILE).exists()


def test_a_report_that_fails_after_training_is_a_warning_not_a_failed_grid(tmp_path, capsys, monkeypatch):
    import ensdiag.report
    from ensdiag.errors import EnsdiagError

    def refuse(*args, **kwargs):
        raise EnsdiagError("the disk is full")
    monkeypatch.setattr(ensdiag.report, "make_report", refuse)
    code, out, err = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--no-geometry",
                             "--out", tmp_path / "run")
    assert code == 0 and "the disk is full" in err and "ensdiag report" in err and str(tmp_path / "run") in out
    assert (tmp_path / "run" / "single" / "seed-1" / "metrics.json").is_file()
