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
        ensdiag.diagnose(lambda x: net(x), id=(torch.randn(8, 4), torch.zeros(8, dtype=torch.long)))
