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


def _bytes_read() -> int:
    """What this process has read through system calls so far (Linux's rchar)."""
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes read with Linux's /proc/self/io")
def test_a_report_read_back_reads_what_the_report_reads_not_a_large_unrelated_file(run_dir, builds):  # noqa: F811
    seed = next(run_dir.glob("deep-ensemble/seed-*"))
    with open(seed / "checkpoint-notes.bin", "wb") as handle:  # 1 GiB, sparse: reading it would read 1 GiB of zeros
        handle.truncate(1 << 30)
    built = rendered(run_dir)
    before = _bytes_read()
    assert rendered(run_dir) == built and len(builds) == 1  # read back
    assert _bytes_read() - before < 64 << 20
    (seed / "checkpoint-notes.bin").write_bytes(b"other bytes")  # not a file the report reads: still read back
    assert rendered(run_dir) == built and len(builds) == 1
    (seed / "notes.txt").write_text("a new file")  # a new name: built again (a report may read it)
    make_report(run_dir)
    assert len(builds) == 2


def test_a_plugin_edited_in_place_builds_the_report_again(run_dir, builds, monkeypatch, tmp_path):  # noqa: F811
    from .test_analyzers import install_plugin
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    install_plugin(plugins, monkeypatch, "cache-plugin", "cache-count = cache_plugin_module:count",
                   "def count(predictions, weights=None):\n    return {}\n", "cache_plugin_module")
    make_report(run_dir)
    make_report(run_dir)
    assert len(builds) == 1
    (plugins / "cache_plugin_module.py").write_text("def count(predictions, weights=None):\n    return {'edited': 1}\n")
    make_report(run_dir)  # the same name and version, other code
    assert len(builds) == 2


def test_a_file_changed_while_the_report_is_built_is_never_served_later(run_dir, builds, monkeypatch):  # noqa: F811
    import ensdiag.report as R
    metrics = next(run_dir.glob("deep-ensemble/seed-*/metrics.json"))
    original = metrics.read_bytes()
    changed = json.loads(original)
    changed["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["value"] = 0.111111
    real = R.load_runs

    def racing(*args, **kwargs):  # the file changes as the report reads it, and is restored before it ends
        atomic_write_json(metrics, changed)
        try:
            return real(*args, **kwargs)
        finally:
            metrics.write_bytes(original)
    monkeypatch.setattr(R, "load_runs", racing)
    assert "0.111111" in json.dumps(make_report(run_dir))
    monkeypatch.setattr(R, "load_runs", real)
    assert "0.111111" not in json.dumps(make_report(run_dir)) and len(builds) == 2


def test_a_figure_replaced_by_a_link_is_drawn_again_and_never_embeds_its_target(run_dir, tmp_path):  # noqa: F811
    import base64
    first = make_report(run_dir)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\n the recipient's own file")
    figure = run_dir / first["figures"][0]["png"]
    figure.unlink()
    figure.symlink_to(secret)
    for _ in range(2):  # built (a link in the folder: no cache), then as the next report finds it
        make_report(run_dir)
        assert not figure.is_symlink() and figure.read_bytes() != secret.read_bytes()
        assert base64.b64encode(secret.read_bytes()).decode() not in (run_dir / "report.html").read_text()
    assert secret.read_bytes().endswith(b"own file")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes read with Linux's /proc/self/io")
def test_a_key_file_that_is_no_key_is_never_read(run_dir, builds, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("ENSDIAG_CACHE", str(tmp_path / "cache"))
    make_report(run_dir)
    key = tmp_path / "cache" / "report-cache.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and key.stat().st_size == 32
    huge = tmp_path / "huge"
    with open(huge, "wb") as handle:
        handle.truncate(1 << 30)
    os.chmod(huge, 0o600)
    good = key.read_bytes()
    for make in (lambda: key.symlink_to(huge), lambda: key.write_bytes(good * 2), lambda: key.write_bytes(good[:31]),
                 lambda: (key.write_bytes(good), key.chmod(0o644))):
        key.unlink()
        make()
        before = _bytes_read()
        make_report(run_dir)
        assert _bytes_read() - before < 64 << 20 and not (run_dir / C.CACHE_FILE).exists()
    assert len(builds) == 5 and huge.stat().st_size == 1 << 30
