"""Bad input from Python is catchable the way Python users catch it: a ValueError (or a TypeError
for a wrong type), and still an EnsdiagError with its one-line message."""

import pytest
import torch

import ensdiag
from ensdiag.errors import EnsdiagError, InputTypeError


def test_errors_are_value_errors_and_type_errors_are_both():
    assert issubclass(EnsdiagError, ValueError)
    assert issubclass(InputTypeError, TypeError) and issubclass(InputTypeError, EnsdiagError)
    assert str(EnsdiagError("two\nlines")) == "two lines"


def test_except_value_error_catches_a_bad_file(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="model.safetensors"):
        ensdiag.load_model(bad)


def test_wrong_logits_shape_from_python_is_a_value_error():
    net = torch.nn.Linear(4, 3)
    with pytest.raises(ValueError):
        ensdiag.diagnose(lambda x: net(x), test=(torch.randn(8, 4), torch.zeros(8, dtype=torch.long)))


def _ensdiag(tmp_path, shell: str, fake_torch: str | None = None):
    """`ensdiag models` (a command that loads torch) in a shell that first runs `shell`, with a torch package
    of `fake_torch`'s source in front of the real one where given."""
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    if fake_torch is not None:
        (tmp_path / "torch").mkdir()
        (tmp_path / "torch" / "__init__.py").write_text(fake_torch)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(["bash", "-c", f'{shell}; exec "$0" -m ensdiag models', sys.executable], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)


linux = pytest.mark.skipif(__import__("sys").platform != "linux", reason="ulimit -v: an address-space limit on Linux")


@linux
@pytest.mark.parametrize("fake_torch", [None, "import os\nos.abort()  # as torch's libraries do on std::bad_alloc\n"])
def test_torch_that_cannot_load_under_an_address_space_limit_is_one_line_naming_the_limit(tmp_path, fake_torch):
    limit = 500_000 if fake_torch is None else 8_000_000  # KiB: too little for the real torch; the fake one aborts
    done = _ensdiag(tmp_path, f"ulimit -v {limit}", fake_torch)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("error: torch cannot be loaded under this process's address-space limit") and \
        f"ulimit -v {limit}" in lines[0] and "internal error" not in lines[0]


@linux
def test_a_broken_torch_install_is_one_line_not_an_internal_error(tmp_path):
    done = _ensdiag(tmp_path, "ulimit -v unlimited", "raise ImportError('libtorch_cpu.so: cannot open shared object')\n")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "torch cannot be loaded (ImportError: libtorch_cpu.so" in lines[0] and "reinstall" in lines[0]


@pytest.mark.parametrize("prefix", ["../../escape", "/etc", "a/./b", "a//b", ""])
def test_a_logger_prefix_that_is_no_name_is_refused_before_anything_is_logged(prefix):
    logged = []

    class Writer:  # TensorBoard's calls, noted
        def add_scalar(self, *args, **kwargs):
            logged.append(args)
        add_image = add_text = flush = add_scalar
    net = torch.nn.Linear(4, 3)
    diagnosis = ensdiag.diagnose([net, torch.nn.Linear(4, 3)],
                                 test=(torch.randn(8, 4), torch.zeros(8, dtype=torch.long)),
                                 measure=ensdiag.Measure(geometry=False))
    with pytest.raises(EnsdiagError, match="prefix .* must be names joined by '/'"):
        diagnosis.log_to(Writer(), prefix=prefix)
    assert logged == []
