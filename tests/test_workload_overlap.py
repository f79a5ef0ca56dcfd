"""Chapter 3 on a workload in the emulated-device mode (preflight.bench.workload_overlap): the stack of
timed waits holds the workload's own parameter shapes, so DDP builds the workload's buckets; run under
torchrun, the small cap's buckets start during backward and one huge bucket cannot. Mechanism checks,
not stopwatch orderings: they hold on a loaded machine."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from conftest import REPO
from preflight.bench import workload_overlap as WO
from preflight.chapters import workload as CW
from preflight.core import workload as W
from preflight.core.findings import FindingSink
from preflight.runner.chapter import Measured

EXAMPLES = REPO / "examples"

# a tied weight (shared by two blocks) and a parameter outside every block
TIED = """
import torch
from torch import nn

class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return self.b(self.a(x)) * self.scale

def build():
    return {"model": Tied(), "batch": lambda: (torch.randn(4, 8), torch.randn(4, 8)),
            "loss": nn.functional.mse_loss, "blocks": ["a", "b"]}
"""


def _times(wl, t=0.003):
    return [{"name": n, "params": 0, "time_s": t} for n in wl.blocks]


def test_emulated_stack_holds_the_workload_shapes_and_waits_its_block_times():
    wl = W.load("tiny_lm.py:build", EXAMPLES)
    log: list = []
    stack = WO.emulated_stack(wl, _times(wl), "cpu", log)
    waits = [w for _, _, w in WO.emulated_groups(wl, _times(wl))]
    real = [tuple(p.shape) for p in wl.model.parameters() if p.requires_grad]
    assert [tuple(p.shape) for p in stack.parameters()] == real          # same order: DDP's buckets alike
    assert [w["name"] for w in waits] == list(wl.blocks)
    assert all(w["forward_s"] == pytest.approx(0.001) and w["backward_s"] == pytest.approx(0.002) for w in waits)
    out = stack(torch.zeros(1, requires_grad=True))
    out.sum().backward()
    # one backward end per block, each at least its 2 ms wait after the one before (sleep never returns early)
    assert len(log) == len(wl.blocks) and all(b - a >= 0.002 for a, b in zip(log, log[1:]))
    assert all(torch.all(p.grad == 1e-3) for p in stack.parameters())


def test_emulated_stack_counts_a_shared_tensor_once_and_keeps_parameters_outside_the_blocks(tmp_path):
    (tmp_path / "tied.py").write_text(textwrap.dedent(TIED))
    wl = W.load("tied.py:build", tmp_path)
    stack = WO.emulated_stack(wl, _times(wl), "cpu")
    waits = [w for _, _, w in WO.emulated_groups(wl, _times(wl))]
    # the model's own scale comes first in parameters() (before its children's), as DDP orders it
    assert [w["name"] for w in waits] == ["(before the blocks)", "a", "b"]
    assert waits[0]["forward_s"] == waits[0]["backward_s"] == 0
    assert [w["params"] for w in waits] == [8, 72, 8]                      # b's weight is a's: counted once
    assert sum(p.numel() for p in stack.parameters()) == wl.params == 88
    (tmp_path / "embed.py").write_text(textwrap.dedent(TIED).replace('"blocks": ["a", "b"]', '"blocks": ["b"]'))
    wl = W.load("embed.py:build", tmp_path)                                # a's bias, registered first: before
    assert [n for n, _, _ in WO.emulated_groups(wl, _times(wl))] == ["(before the blocks)", "b", "(after the blocks)"]


def test_small_cap_is_a_quarter_of_a_small_models_gradients():
    small = [torch.zeros(1000)]                                            # 4 kB of gradients
    caps = WO.bucket_caps_mb(small)
    assert caps["ddp_bucket_small"] == pytest.approx(4000 / 4 / 2**20) and caps["ddp_bucket_huge"] == 2
    assert WO.bucket_caps_mb([torch.zeros(2**22)])["ddp_bucket_small"] == 1.0   # 16 MiB: DDP's usual 1 MiB


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    wl = W.load("tiny_lm.py:build", EXAMPLES)
    return wl, WO.measure(wl, quick=True, mode="emulated")


def test_emulated_run_builds_the_workload_buckets_and_starts_them_in_backward(emulated):
    wl, r = emulated
    assert r["mode"] == "emulated" and r["label"].startswith("emulated device") and not r["cpu_note"]
    assert WO.METHOD.version == 2
    assert r["grad_bytes"] == 4 * wl.params
    by = {row["config"]: row for row in r["rows"]}
    assert set(by) == set(WO.CONFIGS) and not any("loss_after_n" in row for row in r["rows"])
    for cap in ("ddp_bucket_small", "ddp_bucket_default", "ddp_bucket_huge"):
        assert sum(r["buckets"][cap]) == r["grad_bytes"], cap               # every gradient, once per step
    small, huge = by["ddp_bucket_small"], by["ddp_bucket_huge"]
    assert small["buckets"] >= 3 and 1 <= small["launched_in_backward"] <= small["buckets"] - 1
    assert huge["buckets"] == 1 and huge["launched_in_backward"] == 0     # one bucket: after backward
    waits = sum(b["forward_s"] + b["backward_s"] for b in r["emulated_blocks"])
    assert by["compute_only"]["step_s"] >= waits                           # sleeps are lower bounds


def test_overlap_finding_comes_from_the_emulated_run_and_bf16_from_the_real(emulated):
    wl, r = emulated
    real = json.loads(json.dumps(r))                                       # a real-mode stand-in
    real.update(mode="real", label="real (cpu, gloo)", cpu_note=True, device_kind="cpu")
    for row in real["rows"]:
        row.update(loss_after_n=1.0, loss_rel_diff_vs_fp32=0.0)
    sink = FindingSink()
    CW.add_communication_findings(sink, Measured(real, "measured (real)"), Measured(r, "measured (emulated)"))
    f = {x.id: x for x in sink.findings}
    ovl = f["communication/overlap_saving"]
    assert ovl.source == "measured (emulated)" and ovl.message.startswith(f"{wl.label}: ")
    small = {x["config"]: x for x in r["rows"]}["ddp_bucket_small"]
    assert f"{small['launched_in_backward']} of {small['buckets']} buckets started their all-reduce" in ovl.message
    assert f["communication/bf16_saving"].source == f["communication/gradient_bytes"].source == "measured (real)"
    sink = FindingSink()
    CW.add_communication_findings(sink, Measured(real, "measured (real)"))        # on GPUs: the real run only
    assert {x.id: x for x in sink.findings}["communication/overlap_saving"].source == "measured (real)"
    sink = FindingSink()                                                   # a GPU record beats the emulation
    CW.add_communication_findings(sink, Measured(real | {"backend": "nccl"}, "recorded (nccl)"),
                                  Measured(r, "measured (emulated)"))
    assert {x.id: x for x in sink.findings}["communication/overlap_saving"].source == "recorded (nccl)"
    sink = FindingSink()                                                   # the emulated run alone: bytes too
    CW.add_communication_findings(sink, None, Measured(r, "measured (emulated)"))
    f = {x.id: x for x in sink.findings}
    assert f["communication/gradient_bytes"].value == r["grad_bytes"] and f["communication/bf16_saving"].source == "not measured"
