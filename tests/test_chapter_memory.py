"""The memory planner in the audit: the example plan's findings, the cheapest fix, plans the planner
cannot represent, the sliders, and chapter 4's bubble/memory table."""
import math

import pytest

from conftest import EXAMPLE, plan_findings
from preflight.chapters import memory_plan as MP
from preflight.core.findings import FindingSink
from preflight.core.profile import load_profile
from preflight.models import memory as M
from preflight.models import states as S

GiB = 2 ** 30


def _run(**changes):
    return plan_findings(MP.add_plan_findings, **changes)


def test_example_plan_does_not_fit_and_names_the_cheapest_fix():
    out, f = _run(training__grad_dtype="bf16")
    # 7B, no ZeRO, 16-bit gradients: the ZeRO paper's 16 bytes per parameter of model states on every GPU
    assert f["baseline/memory_weights"].value == pytest.approx(2 * 7e9)
    assert f["baseline/memory_grads"].value == pytest.approx(2 * 7e9)
    assert f["baseline/memory_optimizer"].value == pytest.approx(12 * 7e9)
    total = f["baseline/memory_per_gpu"].value
    assert f["baseline/memory_fits"].value == pytest.approx(total / (81559 * 2 ** 20))   # nvidia-smi's H100 total
    assert f["baseline/memory_fits"].verdict == "fail"
    # flash attention (the example's, and the default): no s^2 scores, so ZeRO-1 alone fits
    assert "flash attention" in f["baseline/memory_per_gpu"].message
    assert 17 * GiB < f["baseline/memory_activations"].value < 18 * GiB
    assert "Cheapest change that fits: ZeRO-1 (" in f["baseline/memory_fits"].fix
    fix = out["cheapest"][out["cheapest"]["change"] == "ZeRO-1"].iloc[0]
    assert fix["plan_bytes"] < 80 * GiB
    assert "baseline/memory_gathered_params" not in f                 # nothing gathered without ZeRO-3
    assert "2 B x" in f["baseline/memory_weights"].message and "12 B x params" in f["baseline/memory_optimizer"].message


# The example's terms before flash attention, the profile fields and the framework layouts existed
# (the planner of commit ef5883f on this profile): math attention must give them to the byte.
BEFORE = {"weights": 14e9, "gradients": 14e9, "optimizer": 84e9, "activations": 104152956928.0,
          "activations_output": 608174080.0, "framework": 22749854924.800003}


def test_math_attention_reproduces_the_earlier_plan():
    out, f = _run(model__attention="math", training__grad_dtype="bf16")
    assert dict(zip(out["terms"]["term"], out["terms"]["bytes"])) == pytest.approx(BEFORE, rel=1e-12)
    assert f["baseline/memory_activations"].value == pytest.approx(BEFORE["activations"] + BEFORE["activations_output"])
    assert "ZeRO-1 + selective recompute" in f["baseline/memory_fits"].fix
    assert "math attention" in f["baseline/memory_per_gpu"].message


def test_framework_layouts_in_the_findings():
    _, f = _run(training__framework="megatron", training__zero_stage=1)
    assert f["baseline/memory_grads"].value == pytest.approx(4 * 7e9)                # fp32 main gradients
    assert f["baseline/memory_optimizer"].value == pytest.approx(12 * 7e9 / 1024)
    assert "fp32 main gradients" in f["baseline/memory_grads"].message
    _, f = _run(training__framework="fsdp2", training__zero_stage=3, training__shard_group="node",
                model__mlp="swiglu", model__ffn_hidden=11008, model__kv_heads=8, model__dropout=0.0)
    assert f["baseline/memory_weights"].value == pytest.approx(4 * 7e9 / 8)          # HSDP: 8 ranks per node
    g = f["baseline/memory_gathered_params"]
    assert g.value == pytest.approx(2 * 2 * S.layer_params(4096, 32, 8, 11008, "swiglu"))
    assert "prefetched" in g.message and g.unit == "bytes"
    assert f["baseline/memory_fits"].verdict == "pass"


def test_zero_and_recompute_in_the_profile_make_it_fit():
    _, f = _run(training__zero_stage=1, training__activation_recompute="selective")
    assert f["baseline/memory_fits"].verdict == "pass"
    assert f["baseline/memory_optimizer"].value == pytest.approx(12 * 7e9 / 1024)


def test_profile_memory_overrides_the_table():
    _, f = _run(cluster__gpu_memory_GB=500.0)
    assert f["baseline/memory_fits"].value == pytest.approx(f["baseline/memory_per_gpu"].value / 500e9)   # GB = 1e9 B
    assert f["baseline/memory_fits"].verdict == "pass"


def test_a_plan_the_planner_cannot_split_is_reported_not_crashed():
    # 32 layers over 64 stages: a valid profile (pp divides the GPUs), not a plannable pipeline
    _, f = _run(training__pp=64)
    assert f["baseline/memory_per_gpu"].value is None and f["baseline/memory_per_gpu"].verdict == "info"
    assert "cannot represent" in f["baseline/memory_per_gpu"].message


def test_validation_finding_from_a_recorded_measurement():
    from preflight.runner.chapter import Measured

    res = {"states": [{"term": "weights", "error": 0.0}, {"term": "gradients", "error": 0.0},
                      {"term": "optimizer", "error": 0.0}],
           "activations": {"per_layer_measured": [9703424, 9703424], "per_layer_predicted": 9699328.0,
                           "error": 0.000422},
           "peak": {"device": "cpu", "measured": False}}
    sink = FindingSink()
    MP.add_validation_finding(sink, Measured(res, "recorded"))
    f = sink.findings[0]
    assert f.id == "baseline/memory_model_error" and f.verdict == "pass" and f.value == pytest.approx(0.000422)
    assert "+0.04%" in f.message and "needs a GPU" in f.message


def test_memory_explorer_follows_the_sliders():
    import re

    from preflight.widgets import memory_explorer

    out, _ = _run()
    w = memory_explorer(out["plan"], out["capacity"], 8, 1024)
    tp, pp, zero, recompute, mbs, sp = w.children[1].children

    def value(key):
        m = re.search(rf'data-key="{key}">([^<]*)<', w.children[2].value)
        return m.group(1)

    before = float(value("total").split()[0].replace(",", ""))
    zero.value, recompute.value = 1, "selective"
    after = M.total_bytes(MP.plan_of(load_profile(EXAMPLE), zero_stage=1, recompute="selective"))
    assert value("total") == f"{after / GiB:,.1f} GiB" and after / GiB < before
    assert value("fits").endswith("fits")
    tp.value = 8
    assert value("dp") == "128"
    svg = w.children[3].value
    assert "<svg" in svg and "GPU memory 79.6 GiB" in svg


def test_bubble_memory_table_gpipe_grows_1f1b_does_not():
    bm = MP.bubble_memory_table(load_profile(EXAMPLE), 4)
    g = bm[bm["schedule"] == "GPipe"].set_index("m")["activations (GiB)"]
    o = bm[bm["schedule"] == "1F1B"].set_index("m")["activations (GiB)"]
    assert g[32] > 7 * g[4] and o[32] == pytest.approx(o[4])
    assert all(math.isclose(b, (4 - 1) / (m + 4 - 1)) for b, m in
               zip(bm.loc[bm["schedule"] == "1F1B", "bubble"], bm.loc[bm["schedule"] == "1F1B", "m"]))


def test_auto_capacity_reads_the_device_in_decimal_gb():
    """gpu: auto takes this machine's memory; DeviceInfo.memory_GB is bytes / 1e9, not GiB."""
    from types import SimpleNamespace

    from conftest import example_with
    from preflight.core.profile import parse_profile

    prof = parse_profile(example_with(cluster__gpu="auto"))
    cap, src = MP.capacity_bytes(prof, SimpleNamespace(memory_GB=150.1, label="NVIDIA H200"))
    assert cap == pytest.approx(150.1e9) and "NVIDIA H200" in src


def test_validation_finding_replays_the_recorded_attention_paths():
    """tests/data/cpu_records/memory.json (a real quick CPU run): flash and math paths in the message,
    the verdict on the largest per-layer error."""
    from conftest import CPU_RECORDS
    from preflight.bench import memory as bench_memory
    from preflight.core.records import load_records
    from preflight.runner.chapter import Measured

    [rec] = load_records(CPU_RECORDS, "memory")
    assert bench_memory.METHOD.check(rec) == []
    sink = FindingSink()
    MP.add_validation_finding(sink, Measured(rec["results"], "recorded"))
    f = sink.findings[0]
    paths = rec["results"]["paths"]
    assert f.verdict == "pass" and abs(f.value) == max(abs(p["error"]) for p in paths.values()) and abs(f.value) < 0.01
    assert "gpt flash +0.09%" in f.message and "llama math" in f.message
