"""The project's own files: pins agree, notebooks are committed clean, front-door commands exist."""
import json
import re
import subprocess
import tomllib

import yaml

from conftest import REPO


def _pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pins(reqs):
    out = {}
    for r in reqs:
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)$", r)
        assert m, f"not an exact pin: {r}"
        out[m.group(1).lower()] = m.group(2)
    return out


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    py = _pyproject()
    want = _pins(py["dependencies"] + py["optional-dependencies"]["test"])
    got = _pins([p for p in pip if not p.startswith("-e")])
    assert got == want
    assert any(d == "python=3.11" for d in env["dependencies"] if isinstance(d, str))


def test_torch_pin_is_exact_2_13():
    # a looser range pulls a multi-GB CUDA build on the CPU machines; == takes the local wheel
    assert "torch==2.13.0" in _pyproject()["dependencies"]


def test_notebooks_committed_without_outputs():
    files = subprocess.run(["git", "ls-files", "playbook/*.ipynb"], cwd=REPO, capture_output=True,
                           text=True).stdout.split()
    nbs = files or [str(p.relative_to(REPO)) for p in (REPO / "playbook").glob("*.ipynb")]
    assert nbs, "no chapter notebooks"
    for name in nbs:
        nb = json.loads((REPO / name).read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell["outputs"] and cell["execution_count"] is None, f"{name} has outputs"
        tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{name}: needs exactly one 'parameters' cell for papermill"


def test_front_door_commands():
    readme = (REPO / "README.md").read_text()
    assert "make report" in readme and "make test" in readme
    assert readme.index("make report") < 1500, "the first commands must be the first thing a reader sees"
    make = (REPO / "Makefile").read_text()
    for target in ("report:", "test:", "lab:", "wheelhouse:"):
        assert target in make
    assert "--ip=127.0.0.1" in make
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_slurm_templates_are_valid_bash():
    for p in (REPO / "slurm").glob("*.sbatch"):
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_notebooks_match_their_sources(tmp_path):
    """playbook/*.ipynb are generated from tools/notebooks/*.py (one home for the chapter text)."""
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    import nbgen

    sources = sorted((REPO / "tools" / "notebooks").glob("*.py"))
    assert sources
    for src in sources:
        nbgen.build(src, tmp_path / (src.stem + ".ipynb"))
        committed = REPO / "playbook" / (src.stem + ".ipynb")
        assert (tmp_path / committed.name).read_text() == committed.read_text(), \
            f"{committed.name} differs from {src.name}: run `python tools/nbgen.py`"


def test_device_probe_labels_the_cpu_fallback():
    from preflight.core.device import probe

    d = probe()
    if d.kind == "cpu":
        assert d.label.endswith("(CPU fallback)") and d.notes and d.count >= 1


def _run_pins(*args):
    import sys

    return subprocess.run([sys.executable, str(REPO / "tools" / "pins.py"), *args], capture_output=True, text=True)


def test_pins_lists_pyproject_and_leaves_out_what_is_asked():
    py = _pyproject()
    every = py["dependencies"] + py["optional-dependencies"]["test"]
    r = _run_pins()
    assert r.returncode == 0 and r.stdout.split() == every
    r = _run_pins("--without", "Torch", "--build")
    assert r.returncode == 0
    assert r.stdout.split() == [x for x in every if not x.startswith("torch==")] + ["setuptools>=68", "pip"]
    r = _run_pins("--without", "tensorflow")
    assert r.returncode == 2 and "--without tensorflow" in r.stderr and "accepted: torch" in r.stderr
    assert r.stdout == ""


def test_setup_keep_torch_refuses_an_environment_without_torch(tmp_path):
    """The guard runs before anything is installed: exit 2, a message naming the fix, no marker."""
    import sys

    import pytest

    base = getattr(sys, "_base_executable", sys.executable)      # the interpreter that made .venv
    if subprocess.run([base, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{base} has torch: the refusal cannot be shown with it")
    venv = tmp_path / "v"
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "setup-keep-torch", f"VENV={venv}",
                        f"PYTHON={base}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot import torch" in r.stderr and "make setup" in r.stderr
    assert not (venv / ".keep-torch").exists() and not (venv / ".installed").exists()


def test_jsonschema_skips_the_grammar_compiling_iri_checker():
    """``import preflight`` keeps jsonschema from loading rfc3987-syntax (39 lark grammars compiled at
    import, about 2.5 CPU-s in every kernel and command line; see preflight/__init__.py). Asserted on the
    mechanism: after importing altair and nbformat the package is not loaded, and schema validation
    (the findings schema, a notebook) still works."""
    import sys

    code = ("import sys, json, preflight, altair, nbformat, jsonschema\n"
            "from preflight.core.findings import SCHEMA_PATH\n"
            "assert sys.modules.get('rfc3987_syntax') is None, 'rfc3987_syntax was loaded'\n"
            "jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_PATH.read_text()))\n"
            "nbformat.validate(nbformat.v4.new_notebook())\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
