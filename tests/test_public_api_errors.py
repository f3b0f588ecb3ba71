"""Every failure of the public Python API on bad input is an `EnsdiagError` (a ValueError; an
`InputTypeError` for a wrong type, also a TypeError), as errors.py promises: each public call is
given hostile paths (a file where a folder goes and back, NUL bytes, 5,000 characters, no path at
all) and hostile numbers (10**400, nan, other scripts' digits, the wrong type), and may succeed or
raise that, never an OverflowError, OSError, IsADirectoryError, FileExistsError or a bare
TypeError or ValueError from deep inside."""

import math

import pytest
import torch

import ensdiag
from ensdiag.errors import EnsdiagError

PATHS = [None, 5, 10**400, "\x00", "x\x00.csv", "x" * 5000, "a_file", "a_dir", "a_file/below", b"bytes", object(), True]
NUMBERS = [-1, 10**400, -10**400, math.nan, math.inf, "", "٣", "1h30m5", [], object(), True]


def _members():
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)]


DATA = (torch.randn(20, 4), torch.randint(0, 3, (20,)))


@pytest.fixture(scope="module")
def diagnosis():
    return ensdiag.diagnose(_members(), test=DATA, measure=ensdiag.Measure(geometry=False))


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder holding a file `a_file` and a folder `a_dir` (relative paths land here)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    return tmp_path


def only_ensdiag_errors(call, values):
    for value in values:
        try:
            call(value)
        except EnsdiagError as error:
            assert "\n" not in str(error)
        except Exception as error:  # noqa: BLE001  (the point: any other type is a finding)
            pytest.fail(f"{type(error).__name__} for {str(value)[:30]!r}: {str(error)[:200]}")


@pytest.mark.slow
def test_paths_given_to_the_public_api(diagnosis, place):
    from ensdiag.integrations import tensorboard
    from ensdiag.report import make_report, report_frame
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 3, (1, 8, 8))
    for call in (diagnosis.save, diagnosis.write_files, diagnosis.save_examples, ensdiag.load_model,
                 lambda path: ensdiag.save_model(model, path), ensdiag.import_ensemble, ensdiag.open_ensemble,
                 lambda path: tensorboard.log_diagnosis(diagnosis, path), lambda path: make_report(path, write=False),
                 report_frame, lambda path: ensdiag.diagnose(path, test=DATA, measure=ensdiag.Measure(geometry=False)),
                 lambda path: ensdiag.diagnose(_members(), test=DATA, measure=ensdiag.Measure(geometry=False),
                                               context=ensdiag.Context(initial=path))):
        only_ensdiag_errors(call, PATHS)


def test_the_cases_of_issue_45_are_ensdiag_errors(diagnosis, place):
    from ensdiag.integrations.tensorboard import log_diagnosis
    with pytest.raises(EnsdiagError, match="a_dir is a folder"):
        diagnosis.save_examples("a_dir")
    with pytest.raises(EnsdiagError, match="a_file is a file: TensorBoard writes a folder"):
        log_diagnosis(diagnosis, "a_file")
    for option in ("budget", "precision"):
        with pytest.raises(EnsdiagError, match="finite"):
            ensdiag.diagnose(_members(), test=DATA, measure=ensdiag.Measure(geometry=False, **{option: 10**400}))


@pytest.mark.slow
def test_numbers_given_to_the_public_api(diagnosis, place):
    def diagnose(members=None, normalize=None, **options):
        return ensdiag.diagnose(members or _members(), test=DATA, normalize=normalize,
                                measure=ensdiag.Measure(**{"geometry": False, **options.pop("measure", {})}),
                                context=ensdiag.Context(**options))
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter("tb")
    for call in (lambda v: diagnose(measure={"budget": v}), lambda v: diagnose(measure={"precision": v}),
                 lambda v: diagnose(measure={"seed": v}), lambda v: diagnose(measure={"path_points": v}),
                 lambda v: diagnose(ensdiag.as_ensemble(_members(), num_members=v)), lambda v: diagnose(initial=v),
                 lambda v: diagnose(device=v), lambda v: diagnose(cost={"parameters": v}),
                 lambda v: diagnose(titles={"id": v}), lambda v: diagnose(normalize=(v, 1)),
                 lambda v: ensdiag.diagnose(ensdiag.as_ensemble(_members(), layers=v), test=DATA,
                                            measure=ensdiag.Measure(geometry=True, geometry_examples=8)),
                 lambda v: diagnosis.log_to(writer, step=v), lambda v: diagnosis.to_frame(v),
                 lambda v: ensdiag.build_model("mlp", "deep-ensemble", v, 3, (1, 8, 8)),
                 lambda v: ensdiag.build_model("mlp", "deep-ensemble", 2, v, (1, 8, 8)),
                 lambda v: ensdiag.build_model("mlp", "deep-ensemble", 2, 3, v),
                 lambda v: ensdiag.build_model(v, "deep-ensemble", 2, 3, (1, 8, 8))):
        only_ensdiag_errors(call, NUMBERS)
    writer.close()
