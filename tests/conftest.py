import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "data" / "profiles" / "example.yaml"


def example_with(**changes) -> dict:
    """The example profile as a plain dict, with fields changed by ``section__field=value``
    (``training__zero_stage=1``; nested deeper with more ``__``). Not validated: tests feed it to the
    validator, or to ``plan_findings``."""
    import yaml

    d = yaml.safe_load(EXAMPLE.read_text())
    for path, value in changes.items():
        node = d
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return d


def plan_findings(add_plan_findings, **changes):
    """A chapter's ``add_plan_findings(sink, profile)`` on the example profile with ``changes``
    (validated like a user's profile); returns what it returned and the findings by id."""
    from preflight.findings import FindingSink
    from preflight.profile import parse_profile

    sink = FindingSink()
    out = add_plan_findings(sink, parse_profile(example_with(**changes)))
    return out, {f.id: f for f in sink.findings}


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
