"""The straggler what-if on torch.profiler and Nsight Systems inputs (``stragglers_from_trace``): small
hand-built Kineto jobs whose answer is known (one rank computing 1.5x slower; a balanced job that must not
be called a straggler), the clocks of each rank skewed on purpose, and the shared captures, which must say
precisely why the finding cannot be made from them."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_cli
from preflight.chapters import traces as T
from preflight.diagnose import stragglers_from_trace as F
from test_traces import Trace

NSYS = REPO.parent / "shared" / "nsys" / "mfu_2gpu_before.sqlite"
ID = "load_balance/straggler_cost"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_CACHE", str(tmp_path / "cache"))


def ddp_job(folder: Path, factor: dict[int, float], ranks=4, steps=4, jitter=0.0, seed=0) -> Path:
    """A data-parallel step as DDP runs it, in us: forward, backward in two buckets, each bucket's all-reduce
    on its own stream launched when its gradients are ready (overlapping the next backward part), the
    optimizer after the last all-reduce. A collective ends for every rank once the last has arrived, plus
    200 us of transfer; rank r computes ``factor[r]`` times slower. Each rank's clock is skewed by 777 us x r."""
    rng = np.random.default_rng(seed)
    t = {r: Trace(rank=r, world=ranks, base=1_700_000_000_000_000 + 777 * r) for r in range(ranks)}
    for n in range(steps):
        s0 = 10_000 * n
        f = {r: factor.get(r, 1.0) * (1 + jitter * rng.standard_normal()) for r in range(ranks)}
        fwd = {r: s0 + 100 + 2000 * f[r] for r in range(ranks)}              # forward ends
        b1 = {r: fwd[r] + 1000 * f[r] for r in range(ranks)}                 # bucket 1's gradients ready
        b2 = {r: b1[r] + 1000 * f[r] for r in range(ranks)}                  # bucket 2's
        ar1 = max(b1.values()) + 205                                         # a collective starts 5 us after
        ar2 = max(max(b2.values()) + 5, ar1) + 200                           # the kernel it waits for
        for r in range(ranks):
            x = t[r].step(n + 1, s0, 10_000)
            x.kernel("sm90_xmma_gemm_bf16", s0 + 100, fwd[r] - s0 - 100)
            x.kernel("sm90_xmma_gemm_bf16", fwd[r], b1[r] - fwd[r])
            ar = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": ranks, "dtype": "Float",
                  "In msg nelems": 1 << 20}
            x.kernel("ncclDevKernel_Generic", b1[r] + 5, ar1 - b1[r] - 5, launch=b1[r] - 5, stream=20, Seq=2 * n, **ar)
            x.kernel("sm90_xmma_gemm_bf16", b1[r], b2[r] - b1[r])
            a2 = max(b2[r] + 5, ar1)
            x.kernel("ncclDevKernel_Generic", a2, ar2 - a2, launch=b2[r] - 5, stream=20, Seq=2 * n + 1, **ar)
            x.kernel("vectorized_elementwise_kernel", ar2 + 10, 300, launch=b2[r])
    for r in range(ranks):
        t[r].write(folder / f"rank{r}.json")
    return folder


def audit(folder):
    a = T.audit_traces(folder, jobs=1)
    return a, {f.id: f for f in T.findings(a)}


def why_not(a, f) -> str:
    """Where the traces cannot give the graph: no finding, and the reason in the notes."""
    assert ID not in f and "result" not in a["stragglers"]
    note = next(n for n in a["notes"] if n.startswith(f"{ID} not computed"))
    assert a["stragglers"]["why"] in note
    return note


def test_one_slow_rank_costs_its_slowdown_and_is_named(tmp_path):
    a, f = audit(ddp_job(tmp_path, {2: 1.5}))
    res = a["stragglers"]["result"]
    s = f[ID]
    assert s.value > 1.2 and s.verdict == "fail"
    assert res["quality"]["replay_error"] < 0.01                    # the graph explains the recorded steps
    assert res["quality"]["clock_spread_s"] < 1e-5                  # the skewed clocks lined up on the collectives
    top = res["causes"]["named"][0]
    assert top["cause"] == "slow worker" and "rank 2 " in top["where"][0]
    assert res["by_worker"][0]["rank"] == 2 and max(s.per_rank, key=s.per_rank.get) == "2"
    assert "rank 2" in s.fix and "torch.profiler traces of 4 ranks" in s.source
    # the graph: the optimizer waits for the last all-reduce, the overlapped backward does not wait for the first
    tr, g, _ = F.convert(T.read_any_job(tmp_path))
    kinds = [o[1] for o in tr.ops]
    assert kinds == ["compute", "all_reduce", "compute", "all_reduce", "compute"]
    assert 3 in g.deps[4] and 1 not in g.deps[2]


def test_a_balanced_job_costs_nothing_and_names_no_cause(tmp_path):
    a, f = audit(ddp_job(tmp_path, {}, jitter=0.01))
    s = f[ID]
    assert s.value == pytest.approx(1.0, abs=0.03) and s.verdict == "pass"
    assert a["stragglers"]["result"]["causes"]["named"] == []
    assert "nothing straggles" in s.message


def test_the_cli_json_carries_the_finding(tmp_path):
    ddp_job(tmp_path, {1: 1.5})
    out = run_cli("traces", tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    row = next(x for x in json.loads(out.stdout)["findings"] if x["id"] == ID)
    assert row["chapter"] == 4 and row["value"] > 1.2 and "rank 1 " in row["message"]


def test_the_cli_says_why_not_on_the_example():
    out = run_cli("traces", REPO / "data" / "traces" / "example", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert ID not in {x["id"] for x in doc["findings"]}
    assert any(n.startswith(f"{ID} not computed") and "2 of 128 ranks traced" in n for n in doc["notes"])


def test_collectives_that_differ_between_ranks_are_not_replayed(tmp_path):
    ddp_job(tmp_path, {2: 1.5})
    doc = json.loads((tmp_path / "rank3.json").read_text())
    nccl = [e for e in doc["traceEvents"] if e.get("name") == "ncclDevKernel_Generic"]
    doc["traceEvents"].remove(nccl[-1])                                  # rank 3 misses an all-reduce of step 4
    doc["traceEvents"].remove(nccl[2])                                   # and one of step 2
    (tmp_path / "rank3.json").write_text(json.dumps(doc))
    a, f = audit(tmp_path)
    assert "rank 3 step 2 runs 1 communication ops" in why_not(a, f)


def test_one_rank_is_not_a_guess(tmp_path):
    ddp_job(tmp_path, {}, ranks=1)
    assert "one rank's trace" in why_not(*audit(tmp_path))


def test_the_embedded_example_says_why_not():
    """Two ranks of a 128-rank job: the what-if would need the other 126 ranks' arrivals."""
    assert "torch.profiler traces: 2 of 128 ranks traced" in why_not(*audit(REPO / "data" / "traces" / "example"))


@pytest.mark.skipif(not NSYS.is_file(), reason="../shared/nsys/mfu_2gpu_before.sqlite is absent")
def test_the_nsys_capture_says_why_not(tmp_path):
    """A 300 ms window of two GPUs with no NVTX step range: ops cannot be given a step."""
    shutil.copy(NSYS, tmp_path / NSYS.name)
    note = why_not(*audit(tmp_path))
    assert "Nsight Systems exports: rank 0's trace has no numbered step in its window (no NVTX step range)" in note


def test_send_recv_with_peers_form_a_pipeline(tmp_path):
    """Two stages x two replicas: each send names its peer (PyTorch's Dst Rank / Src Rank); stage 1 of
    replica 1 (rank 3) computes 1.5x slower. Stages 0 = ranks 0, 1; the all-reduce is over the dp ranks."""
    grid = {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}                # rank -> (dp, stage)
    peer = {(d, s): r for r, (d, s) in grid.items()}
    t = {r: Trace(rank=r, world=4, base=1_700_000_000_000_000 + 500 * r) for r in grid}
    for n in range(4):
        s0 = 10_000 * n
        slow = {r: 1.5 if r == 3 else 1.0 for r in grid}
        for d in (0, 1):
            a, b = peer[(d, 0)], peer[(d, 1)]
            f0 = s0 + 100 + 1000 * slow[a]                                  # stage 0 forward ends, sends
            x = f0 + 100                                                    # the activation arrives on stage 1
            f1 = x + 1000 * slow[b]                                         # stage 1 forward + backward
            g = f1 + 1000 * slow[b]
            y = g + 100                                                     # the gradient arrives on stage 0
            b0 = y + 1000 * slow[a]
            t[a].kernel("sm90_xmma_gemm_bf16", s0 + 100, f0 - s0 - 100)
            pg = {"Global rank start": a, "Global rank stride": b - a, "Process Group Name": f"pp{d}"}  # ranks a, b
            t[a].kernel("ncclDevKernel_SendRecv", f0, x - f0, stream=30, **{"Collective name": "send", "Dst Rank": 1}, **pg)
            t[b].kernel("ncclDevKernel_SendRecv", s0 + 100, x - s0 - 100, stream=30,
                        **{"Collective name": "recv", "Src Rank": 0}, **pg)
            t[b].kernel("sm90_xmma_gemm_bf16", x, f1 - x).kernel("sm90_xmma_gemm_bf16", f1, g - f1)
            t[b].kernel("ncclDevKernel_SendRecv", g, y - g, stream=30, **{"Collective name": "send", "Dst Rank": 0}, **pg)
            t[a].kernel("ncclDevKernel_SendRecv", f0 + 50, y - f0 - 50, stream=30,
                        **{"Collective name": "recv", "Src Rank": 1}, **pg)
            t[a].kernel("sm90_xmma_gemm_bf16", y, b0 - y)
        done = {}
        for st in (0, 1):
            r0, r1 = peer[(0, st)], peer[(1, st)]
            last = {r: max(e["ts"] + e["dur"] for e in t[r].ev if e.get("cat") == "kernel") - t[r].base for r in (r0, r1)}
            end = max(last.values()) + 200
            for r in (r0, r1):
                t[r].kernel("ncclDevKernel_Generic", last[r], end - last[r], stream=20, **{
                    "Collective name": "allreduce", "Group size": 2, "Process Group Name": f"dp{st}"})
                done[r] = end
        for r in grid:
            t[r].kernel("vectorized_elementwise_kernel", done[r] + 10, 200)
            t[r].step(n + 1, s0, 10_000)
    for r in grid:
        t[r].write(tmp_path / f"rank{r}.json")
    a, f = audit(tmp_path)
    res = a["stragglers"].get("result")
    assert res is not None, a["stragglers"]
    assert res["job"]["pp_size"] == 2 and res["job"]["dp_size"] == 2
    assert {o[1] for o in F.convert(T.read_any_job(tmp_path))[0].ops} >= {"forward-send", "backward-recv", "all_reduce"}
    assert f[ID].value > 1.05 and res["by_worker"][0]["rank"] == 3 and res["quality"]["replay_error"] < 0.01
    top = res["causes"]["named"][0]
    assert top["cause"] == "slow worker" and top["where"][0].startswith("rank 3 = dp 1, stage 1")
