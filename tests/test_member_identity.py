"""A member is its file or folder, whatever path names it: the same predictions file, lm-eval log,
checkpoint, adapter folder or module given twice (again, through a link, a hard link or another
spelling of its path, or inside a folder also given) is refused in one line on every path, never
read as a second member that agrees with the first (JSD 0, disagreement 0)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from .cli import assert_one_line_error, run_cli

LM_EVAL = Path(__file__).parent / "fixtures" / "lm_eval" / "out" / "lora-r4"
MEMBERS = sorted(LM_EVAL.iterdir())
LORA = Path(__file__).parent / "fixtures" / "lora"


def again(path: Path, folder: Path) -> dict:
    """`path` named again: itself, a link and a hard link (files) made in `folder`, a path with `..` in it."""
    folder.mkdir(exist_ok=True)
    names = {"itself": path, "a link": folder / f"link-{path.name}",
             "a path through ..": path.parent / ".." / path.parent.name / path.name}
    os.symlink(path, names["a link"])
    if path.is_file():
        names["a hard link"] = folder / f"hard-{path.name}"
        os.link(path, names["a hard link"])
    return names


@pytest.fixture
def npy(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(tmp_path / f"m{i}.npy", rng.normal(size=(20, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 20))
    return tmp_path


def test_a_members_npy_file_given_twice_is_refused(npy, capsys):
    for how, path in again(npy / "m0.npy", npy / "links").items():
        assert_one_line_error(capsys, "analyze", npy / "m0.npy", npy / "m1.npy", path, "--labels", npy / "y.npy",
                              match="(given twice|are the same file or folder \\(after links\\)): one member's predictions "
                                    "file would count as two members")
        assert_one_line_error(capsys, "analyze", npy / "m0.npy", npy / "m1.npy", "--labels", npy / "y.npy",
                              "--ood", npy / "m0.npy", "--ood", path, match="would count as two members")
    assert run_cli(capsys, "analyze", npy / "m0.npy", npy / "m1.npy", "--labels", npy / "y.npy")[0] == 0


def test_an_lm_eval_run_given_twice_is_refused_however_it_is_named(capsys, tmp_path):
    for how, path in again(MEMBERS[0], tmp_path / "folders").items():
        assert_one_line_error(capsys, "analyze", MEMBERS[0], MEMBERS[1], path, "--task", "ensq",
                              match="(given twice|the same file or folder|are one member)")
    samples = next(MEMBERS[1].glob("samples_ensq_*.jsonl"))
    for how, path in again(samples, tmp_path / "files").items():
        assert_one_line_error(capsys, "analyze", MEMBERS[0], samples, path,
                              match="(given twice|the same file or folder|are one member)")
    # a model folder and a samples file in it; an output folder and one of its model folders: one log read twice
    assert_one_line_error(capsys, "analyze", MEMBERS[0], MEMBERS[1], samples, "--task", "ensq",
                          match=f"{MEMBERS[1]} and {samples} are one member: both read")
    assert_one_line_error(capsys, "analyze", LM_EVAL, MEMBERS[2], "--task", "ensq", match="are one member: both read")
    assert_one_line_error(capsys, "analyze", *MEMBERS[:2], "--task", "ensq", "--ood-task", "ensood",
                          "--ood", MEMBERS[0], "--ood", MEMBERS[0], match="given twice")


def test_copies_of_one_log_in_other_folders_are_still_two_members(capsys, tmp_path):
    """Identity is the file, not its bytes: copies are what a user may mean (and other tests use)."""
    copy = shutil.copytree(MEMBERS[0], tmp_path / "copy")
    code, _, err = run_cli(capsys, "analyze", MEMBERS[0], copy, "--task", "ensq", "--format", "json")
    assert code == 0, err


def test_a_checkpoint_or_adapter_folder_given_twice_is_refused(capsys, tmp_path):
    import ensdiag
    from ensdiag.errors import EnsdiagError
    torch.manual_seed(0)
    for i in range(2):  # plain PyTorch members: an ensdiag single model's network each
        torch.save(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)).body.state_dict(), tmp_path / f"m{i}.pt")
    assert ensdiag.import_ensemble([tmp_path / "m0.pt", tmp_path / "m1.pt"]).num_members == 2
    for how, path in again(tmp_path / "m0.pt", tmp_path / "l").items():
        with pytest.raises(EnsdiagError, match="would count as two members"):
            ensdiag.import_ensemble([tmp_path / "m0.pt", tmp_path / "m1.pt", path])
        assert_one_line_error(capsys, "diversity", tmp_path / "m0.pt", path, "--no-geometry", match="checkpoint")
    adapter = LORA / "adapter-0"
    for how, path in again(adapter, tmp_path / "a").items():
        assert_one_line_error(capsys, "diversity", adapter, LORA / "adapter-1", path, match="given twice")


def test_the_same_module_given_twice_from_python_is_refused():
    import ensdiag
    from ensdiag.errors import EnsdiagError
    net, other = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    with pytest.raises(EnsdiagError, match="member 2 is member 0 \\(the same module object\\)"):
        ensdiag.diagnose([net, other, net], test=(x, y), measure=ensdiag.Measure(geometry=False))
    assert ensdiag.diagnose([net, other], test=(x, y), measure=ensdiag.Measure(geometry=False)).metrics["num_members"] == 2
