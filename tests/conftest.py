import pytest
import torch


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
