import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "data" / "profiles" / "example.yaml"


@pytest.fixture
def example_yaml() -> str:
    return EXAMPLE.read_text()


def run_cli(*args, cwd=None, timeout=900):
    """Run ``python -m preflight ...`` as a user would; return the CompletedProcess."""
    import subprocess

    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".pytest_cache" / "inductor"))
    return subprocess.run([sys.executable, "-m", "preflight", *map(str, args)], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)
