"""Issue 34's corrections, each against its source: DDP's AMP layout, nvidia-smi's H100 capacity, the
gradients' bytes following grad_dtype, the failure-rate default, the plan's own batching."""
from pathlib import Path

import pytest

from preflight.chapters import load_balance as C4
from preflight.chapters import memory_plan as MP
from preflight.core.findings import FindingSink
from preflight.core.hardware import CHIPS
from preflight.core.profile import ProfileError, load_profile, parse_profile
from preflight.models import memory as M
from preflight.models import resilience as R
from preflight.models import states as S

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "data/profiles/example.yaml"


def _example(**sections):
    d = load_profile(EXAMPLE).model_dump()
    for name, fields in sections.items():
        d[name].update(fields)
    return parse_profile(d)


def test_ddp_with_torch_amp_holds_20_bytes_per_param_16_with_bucket_view():
    """PyTorch DDP + torch.autocast: fp32 parameters (4), fp32 .grad (4) and DDP's bucket copy (4), Adam
    m and v (8); gradient_as_bucket_view=True makes .grad a view of the bucket (DDP docs)."""
    assert sum(S.layout("ddp")) == 20 and sum(S.layout("ddp", bucket_view=True)) == 16
    p = _example(training={"framework": "ddp", "zero_stage": 0})
    q = _example(training={"framework": "ddp", "zero_stage": 0, "gradient_as_bucket_view": True})
    grads = [dict(zip(M.terms(MP.plan_of(x))["term"], M.terms(MP.plan_of(x))["bytes"]))["gradients"] for x in (p, q)]
    assert grads[0] == pytest.approx(2 * grads[1])
    with pytest.raises(ProfileError, match="gradient_as_bucket_view"):
        _example(training={"gradient_as_bucket_view": True})
    with pytest.raises(ProfileError, match="replicates the whole model"):
        _example(training={"framework": "ddp", "zero_stage": 0, "tp": 2})


def test_h100_capacity_is_nvidia_smis_81559_mib_not_80_gib():
    h100 = CHIPS["H100-SXM"]
    assert h100.capacity_bytes == 81559 * 2 ** 20 < 80 * 2 ** 30
    cap, src = MP.capacity_bytes(load_profile(EXAMPLE))
    assert cap == h100.capacity_bytes and "81,559 MiB" in src
    assert CHIPS["B200"].capacity_bytes == 180e9          # no recorded total: the marketed GB as 1e9 bytes
    assert MP.capacity_bytes(_example(cluster={"gpu_memory_GB": 96}))[0] == 96e9


def test_gradient_bytes_follow_grad_dtype_where_the_framework_keeps_them_so():
    """DeepSpeed keeps gradients in their reduce dtype (grad_accum_dtype), Megatron's main grads are fp32
    unless --grad-reduce-in-bf16; FSDP2's sharded gradients stay fp32 (they follow its fp32 parameters)."""
    assert S.layout("deepspeed", grad_dtype="fp32")[1] == 4 and S.layout("deepspeed", grad_dtype="bf16")[1] == 2
    assert S.layout("megatron", grad_dtype="bf16")[1] == 2 and S.layout("fsdp2", grad_dtype="bf16")[1] == 4
    fp32, bf16 = (_example(training={"grad_dtype": g}) for g in ("fp32", "bf16"))
    g = [dict(zip(M.terms(MP.plan_of(x))["term"], M.terms(MP.plan_of(x))["bytes"]))["gradients"] for x in (fp32, bf16)]
    assert g[0] == pytest.approx(2 * g[1])


def test_failure_rate_default_is_llama3s_measured_rate():
    d = load_profile(EXAMPLE).model_dump()
    del d["cluster"]["node_failure_per_day"]
    assert parse_profile(d).cluster.node_failure_per_day == pytest.approx(R.LLAMA3_P_NODE_DAY, rel=1e-3)


@pytest.mark.parametrize("batching, verdict", [("pad", "fail"), ("bucket", "warn"), ("pack", "pass")])
def test_padding_waste_judges_the_plans_own_batching(batching, verdict):
    p = _example(data={"batching": batching})
    sink = FindingSink()
    C4.add_plan_findings(sink, p)
    f = next(x for x in sink.findings if x.id == "load_balance/padding_waste")
    assert f.verdict == verdict and f"data.batching = {batching}" in f.message


def test_a_ddp_plan_is_never_told_to_use_tensor_or_pipeline_parallelism():
    """Plain DDP replicates the whole model: the cheapest fix is another wrapper (FSDP2) or recompute, not tp."""
    p = _example(training={"framework": "ddp", "zero_stage": 0})
    sink = FindingSink()
    MP.add_plan_findings(sink, p)
    fix = next(x for x in sink.findings if x.id == "baseline/memory_fits").fix
    assert "tp=" not in fix and "pp=" not in fix and "FSDP2 full sharding" in fix
