"""The workload contract (preflight.core.workload, preflight.runner.workload_check): loading, every kind of bad
input, the counts of a model with a closed form, and records that name the workload they measured."""
from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from conftest import REPO, example_with, run_cli
from preflight.core import workload as W
from preflight.runner import workload_check as WC

EXAMPLES = REPO / "examples"
TESTS = REPO / "tests" / "data" / "workloads"

GOOD = """
import torch
from torch import nn
from torch.nn import functional as F

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

def build():
    return {BODY}
"""
PARTS = {"model": "Net()", "batch": "lambda: (torch.randn(3, 4), torch.randint(0, 2, (3,)))",
         "loss": "F.cross_entropy"}


def write(tmp_path, body: str | None = None, source: str | None = None, **parts) -> str:
    """A workload file in ``tmp_path``: GOOD with ``build()`` returning ``PARTS`` changed by ``parts``
    (a value None drops the key), or ``body`` as build's return expression, or ``source`` whole."""
    if source is None:
        d = {k: v for k, v in (PARTS | parts).items() if v is not None}
        body = body or "{" + ", ".join(f"{k!r}: {v}" for k, v in d.items()) + "}"
        source = GOOD.replace("{BODY}", body)
    (tmp_path / "wl.py").write_text(textwrap.dedent(source))
    return "wl.py:build"


def check(tmp_path, entry="wl.py:build"):
    return WC.check(W.load(entry, tmp_path))


def test_examples_satisfy_the_contract():
    lm = WC.check(W.load("tiny_lm.py:build", EXAMPLES))
    assert lm["class"] == "TinyLM" and lm["tokens_per_sample"] == 32
    assert lm["blocks"] == ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]
    cnn = WC.check(W.load("small_cnn.py:build", EXAMPLES))
    assert cnn["class"] == "SmallCNN" and cnn["blocks"] == ["stage1", "stage2", "classifier"]
    assert cnn["params_with_grad"] == cnn["params"]


def test_package_entry_and_the_same_weights_each_build(tmp_path, monkeypatch):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    write(tmp_path / "mypkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = W.load("mypkg.wl:build"), W.load("mypkg.wl:build")
    assert a.describe() == {"entry": "mypkg.wl:build", "class": "Net", "params": 10}
    assert all((p == q).all() for p, q in zip(a.model.parameters(), b.model.parameters()))    # seeded


def test_closed_form_model_params_exact_and_flops_within_one_percent():
    """A model that is not a Transformer: the audit's counts against the closed form."""
    import sys

    from preflight.bench import workload_baseline as B

    wl = W.load("closed_form.py:build", TESTS)
    CF = sys.modules["preflight_workload_closed_form"]          # the module holds the closed form
    inputs, targets = wl.batch()
    f = B.count_flops(wl, inputs, targets)
    assert wl.params == CF.PARAMS
    assert f["per_sample"] == pytest.approx(CF.FLOPS_PER_SAMPLE, rel=0.01)
    assert f["formula_per_sample"] is None and f["transformer"] is None       # no 6N formula for a CNN/MLP


def test_transformer_formula_beside_the_count():
    from preflight.bench import workload_baseline as B

    wl = W.load("tiny_lm.py:build", EXAMPLES)
    f = B.count_flops(wl, *wl.batch())
    assert f["transformer"]["layers"] == 4 and f["transformer"]["hidden"] == 64
    assert 0.95 < f["ratio_counted_to_formula"] < 1.05


BAD = [
    (dict(source="import nonexistent_pkg_xyz\ndef build(): pass\n"), "importing wl.py raised ModuleNotFoundError"),
    (dict(source="x = 1\n"), "has no 'build'"),
    (dict(source="build = 3\n"), "build is not callable (it is a int)"),
    (dict(source="def build():\n    return 1 / 0\n"), "build() raised ZeroDivisionError: division by zero (wl.py:2)"),
    (dict(body="[1, 2]"), "build() returned no model, batch, loss (a list)"),
    (dict(modle="Net()"), "unknown key(s) modle"),
    (dict(model="'a model'"), "model is a str, expected a torch.nn.Module"),
    (dict(model="nn.ReLU()"), "has no parameters"),
    (dict(batch="42"), "batch is a int, expected a callable"),
    (dict(tokens_per_sample="0"), "tokens_per_sample = 0"),
    (dict(blocks="['fc', 'nope']"), "blocks names 'nope', which is not a submodule of Net"),
    (dict(batch="lambda: torch.randn(3, 4)"), "batch() returned a Tensor; expected a pair (inputs, targets)"),
    (dict(batch="lambda: ([1.0, 2.0], torch.zeros(2))"), "batch() inputs hold a float; expected tensors"),
    (dict(batch="lambda: (torch.randn(3, 5), torch.zeros(3, dtype=torch.long))"),
     "the forward of Net raised RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    (dict(loss="lambda out, y: F.cross_entropy(out, y, reduction='none')"),
     "loss returned a tensor of shape (3,); expected a scalar floating-point tensor"),
    (dict(loss="lambda out, y: torch.tensor(1.0)"), "the loss does not depend on the model's parameters"),
    (dict(optimizer="lambda params: 'sgd'"), "optimizer returned a str; expected a torch.optim.Optimizer"),
]


@pytest.mark.parametrize(("change", "expected"), BAD, ids=[e for _, e in BAD])
def test_bad_workload_is_named_with_what_is_wrong(tmp_path, change, expected):
    entry = write(tmp_path, **change)
    with pytest.raises(W.WorkloadError) as err:
        check(tmp_path, entry)
    assert str(err.value).startswith(f"workload {entry}: ")
    assert expected in str(err.value)


def test_missing_file_and_module(tmp_path):
    with pytest.raises(W.WorkloadError, match=r"workload nope.py:build: file .*nope.py not found"):
        W.load("nope.py:build", tmp_path)
    with pytest.raises(W.WorkloadError, match=r"module 'no_such_module_xyz' not found"):
        W.load("no_such_module_xyz.sub:build", tmp_path)


def test_preflight_check_in_a_subprocess_times_out_on_a_hang(tmp_path):
    entry = write(tmp_path, source="import time\ndef build():\n    time.sleep(600)\n")
    with pytest.raises(W.WorkloadError, match="did not finish in 8 s"):
        WC.preflight_check(entry, tmp_path, timeout_s=8)


def _profile(tmp_path, entry: str, **changes) -> str:
    d = example_with(cluster__gpu="auto", project="wl-test", **changes)
    d["workload"] = {"entry": entry}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(d))
    return str(tmp_path / "p.yaml")


def test_audit_refuses_a_bad_workload_before_anything_is_written(tmp_path):
    write(tmp_path, loss="lambda out, y: out")                 # not a scalar
    out = tmp_path / "report"
    r = run_cli("audit", _profile(tmp_path, "wl.py:build"), "--out", out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "workload wl.py:build: loss returned a tensor of shape (3, 2)" in r.stderr
    assert "field workload.entry" in r.stderr and not out.exists()


def test_records_name_their_workload(tmp_path):
    """A workload record is used only for that workload: never for another, never for the reference."""
    from preflight.bench import baseline as bench_baseline
    from preflight.bench import workload_baseline as B
    from preflight.core.device import probe
    from preflight.core.records import save_record
    from preflight.runner.chapter import start

    write(tmp_path)
    results = tmp_path / "results"
    ch = start("baseline", _profile(tmp_path, "wl.py:build"), plan_only=True, results_dir=str(results))
    me = ch.workload.describe()
    fields = {k: {} for k in B.METHOD.required}
    for name, who in (("other", me | {"params": 11}), ("mine", me)):
        save_record(B.METHOD.record({"workload": who}, fields | {"workload": who, "which": name},
                                    probe().as_dict()), results, name=name)
    got = ch.workload_measurement(B.METHOD, lambda: pytest.fail("plan-only: nothing is measured live"))
    assert got.results["which"] == "mine"
    assert ch.measurement(bench_baseline.METHOD, lambda: None) is None          # the reference: no record fits
    logged = ch.measurements[0]
    assert logged["origin"] == "recorded" and logged["record"].endswith("workload_baseline-mine.json")


def test_live_record_params_carry_the_workload(tmp_path):
    from preflight.core.records import Method
    from preflight.runner.chapter import start

    write(tmp_path)
    ch = start("baseline", _profile(tmp_path, "wl.py:build"), out_dir=str(tmp_path / "out"))
    ch.workload_measurement(Method("workload_probe", 1), lambda: {"x": 1})
    rec = json.loads((tmp_path / "out" / "records" / "workload_probe.json").read_text())
    assert rec["params"]["workload"] == {"entry": "wl.py:build", "class": "Net", "params": 10}


def test_plan_only_imports_no_workload(tmp_path):
    from preflight.runner.chapter import start

    write(tmp_path, source="raise SystemExit('must not be imported')\n")
    assert start("baseline", _profile(tmp_path, "wl.py:build"), plan_only=True).workload is None


def test_blocks_in_sequence_or_why_not():
    from preflight.bench import workload_pipeline as P

    lm = W.load("tiny_lm.py:build", EXAMPLES)
    assert P.in_sequence(lm, lm.batch()[0]) == (True, "the blocks applied in order give the model's output")
    times = P.block_times(lm, quick=True)
    assert [t["name"] for t in times] == list(lm.blocks) and all(t["time_s"] > 0 for t in times)
    cf = W.load("closed_form.py:build", TESTS)                 # flatten and ReLU between its blocks
    ok, why = P.in_sequence(cf, cf.batch()[0])
    assert not ok and "do not run in sequence" in why


UNSEEDED = """
import torch
from torch import nn
from torch.nn import functional as F

class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.g = torch.Generator().manual_seed(123)      # its own generator: no checkpoint holds its state

    def forward(self, x):
        return self.fc(x + 0.1 * torch.randn(x.shape, generator=self.g))

def build():
    g = torch.Generator().manual_seed(0)
    return {"model": Noisy(), "loss": F.cross_entropy,
            "batch": lambda: (torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))}
"""


@pytest.mark.slow
def test_resume_names_the_state_a_workload_hides(tmp_path):
    """SIGKILL and resume of a model with a random op on a generator of its own: not bitwise, from the
    first resumed step, and the missing state named."""
    from preflight.bench import workload_resume as R

    entry = write(tmp_path, source=UNSEEDED)
    r = R.measure_resume(W.load(entry, tmp_path), tmp_path / "work", quick=True)
    assert not r["resume_bitwise"] and r["first_divergent_step"] == r["checkpoint_step"] + 1
    assert r["probe"]["forward_reproducible"] is False
    assert "unseeded random op" in r["missing_state"]


def test_missing_state_from_batches_then_the_probe():
    import pandas as pd

    from preflight.bench.workload_resume import missing_state

    ref = pd.DataFrame({"step": [1, 2, 3], "batch": ["a", "b", "c"]})
    other = pd.DataFrame({"step": [1, 2, 3], "batch": ["a", "b", "x"]})
    assert "the batch stream" in missing_state(ref, other, {}) and "from step 3" in missing_state(ref, other, {})
    assert "unseeded random op" in missing_state(ref, ref, {"forward_reproducible": False})
    assert "persistent=False): mask" in missing_state(ref, ref, {"forward_reproducible": True,
                                                                 "non_persistent_buffers": ["mask"]})
    assert "state outside" in missing_state(ref, ref, {"forward_reproducible": True, "non_persistent_buffers": []})
