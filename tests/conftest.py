import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leaked_dump():
    """Every test starts and ends without an active dump session."""
    from xray.record import session

    yield
    if session._ACTIVE is not None:
        session.end_dump()
        pytest.fail("test left a dump session active")


@pytest.fixture(scope="session")
def llama():
    from xray.demo.models import tiny_llama

    return tiny_llama(layers=2, hidden=64)


@pytest.fixture(scope="session")
def tokens():
    from xray.demo.models import token_batch

    return token_batch(batch=2, seq=16, vocab=256)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
