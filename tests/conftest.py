import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global RNG state, so failures reproduce."""
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Decompressed dataset copies go to a per-session folder, not the user's cache."""
    monkeypatch.setenv("ENSDIAG_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
