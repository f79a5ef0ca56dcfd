"""Beyond one machine: a real two-node Slurm cluster (``slurm_cluster(..., nodes=2)``: nodes n1 and n2,
two slurmd on this host) running the README's "Across nodes" commands as written, then the audit over
their records; and the walltime-requeue template with ``--nodes=2``.

The only changes this box needs (as in tests/test_cluster_path.py): ``sbatch --wait`` (the test waits
for each job), ``--gpus-per-node=0 --cpus-per-task=1`` for the GPU option (one core per node, no GPU),
``DEVICE=cpu`` and ``QUICK=1`` in the environment (the templates' knobs), ``--quick`` after
``--out results/``, and a free ``RDZV_PORT``. Both "nodes" share one host: Slurm, srun, the rendezvous
and gloo between the nodes' processes are real; the network is loopback (the findings say so).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, example_with, run_cli
from preflight.harness.launch import free_port
from slurm_cluster import slurm_cluster
from test_cluster_path import as_on_this_box, readme_blocks
from test_slurm import SBATCH, _allocations, _losses, _report

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster(tmp_path):
    with slurm_cluster(tmp_path / "cluster", nodes=2) as c:
        yield c


def nodes_block() -> list[str]:
    """The README's "Across nodes (Slurm)" block: the third bash block of the cluster section."""
    block = readme_blocks()[2]
    assert block[0] == "export RESULTS=$PWD/results" and all(c.startswith("sbatch ") for c in block[1:]), block
    return block


def as_on_this_cluster(cmd: str) -> str:
    """A documented line at this cluster's size (see the module docstring)."""
    cmd = re.sub(r"^sbatch ", "sbatch --wait ", cmd)
    cmd = re.sub(r"--gpus-per-node=\d+", "--gpus-per-node=0 --cpus-per-task=1", cmd)
    return cmd.replace("--out results/", "--out results/ --quick")


def run_lines(cluster, work: Path, want: str, timeout: float = 600) -> tuple[list[str], float]:
    """The export line and the block's lines containing ``want``, as one bash script in ``work``
    (where ``slurm/`` is the repository's); (the lines run, seconds)."""
    lines = [ln for ln in nodes_block() if ln.startswith("export ") or want in ln]
    assert len(lines) >= 2, f"no README line with {want!r}"
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "slurm").exists():
        (work / "slurm").symlink_to(REPO / "slurm")
    env = dict(cluster.env, DEVICE="cpu", QUICK="1", PYTHON=sys.executable, RDZV_PORT=str(free_port()),
               PYTHONUNBUFFERED="1", PATH=f"{Path(sys.executable).parent}:{cluster.env['PATH']}")
    script = "set -euo pipefail\n" + "\n".join(as_on_this_cluster(ln) for ln in lines)
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    outputs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(work.glob("*.out")))
    assert r.returncode == 0, f"{script}\n{r.stdout}\n{r.stderr}\n{outputs}\n{cluster.diagnostics()}"
    return lines, time.monotonic() - t0


def audit(work: Path, chapter: int) -> tuple[dict, Path]:
    """``python -m preflight audit my.yaml --results results/``, this chapter only and --plan-only (the
    other measurements are not in this folder); (findings by id, the report folder)."""
    (work / "my.yaml").write_text(yaml.safe_dump(example_with(cluster__gpu="auto", project="nodes")))
    out = work / f"report-{chapter}"
    r = run_cli("audit", "my.yaml", "--results", "results/", "--plan-only", "--chapters", str(chapter),
                "--out", str(out), cwd=work, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "findings.json").read_text())
    assert all(c["status"] == "ok" for c in summary["chapters"]), summary["chapters"]
    return {f["id"]: f for f in summary["findings"]}, out


def html_tables(text: str) -> list[list[list[str]]]:
    """Every HTML table in ``text`` as rows of cell texts (header row first; ``_`` in a column name
    reads as a space, as the chapter's tables show it)."""
    tables = []
    for t in re.findall(r"<table.*?</table>", text, re.S):
        rows = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, re.S)]
                for tr in re.findall(r"<tr.*?</tr>", t, re.S)]
        rows = [r for r in rows if r]
        tables.append([[c.replace("_", " ") for c in rows[0]], *rows[1:]] if rows else [])
    return tables


def notebook_text(out: Path, chapter: str) -> str:
    nb = json.loads(next((out / "notebooks").glob(f"*_{chapter}.ipynb")).read_text())
    parts = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            parts.append("".join(o.get("text", "")))
            parts.extend("".join(v) for k, v in o.get("data", {}).items() if k in ("text/html", "text/plain"))
    return "\n".join(parts)


def _save(tmp_path_factory, name: str, result: dict) -> None:
    (tmp_path_factory.getbasetemp() / f"{name}.json").write_text(json.dumps(result, indent=1))


def test_two_nodes_one_task_each(cluster, capsys):
    assert cluster.node_states() == {"n1": "idle", "n2": "idle"}
    r = cluster.run("srun", "--nodes=2", "--ntasks=2", "bash", "-c", "echo $SLURMD_NODENAME $SLURM_NODEID", timeout=60)
    assert r.returncode == 0, r.stderr + cluster.diagnostics()
    assert sorted(r.stdout.split()) == ["0", "1", "n1", "n2"] and sorted(r.stdout.strip().split("\n")) == \
        ["n1 0", "n2 1"], r.stdout
    _report(capsys, f"Slurm two-node bring-up: {cluster.bringup_s:.1f} s")


def test_staged_scaling_across_nodes_feeds_chapter_1(cluster, tmp_path, tmp_path_factory, capsys):
    """scaling_stages.sbatch at 1 and 2 nodes (one process each): two records, the second across
    nodes; the audit's chapter 1 puts both on the staged curve, measured, with the stop rule applied."""
    t0 = time.monotonic()
    _, jobs_s = run_lines(cluster, tmp_path, "scaling_stages.sbatch")
    recs = {int(json.loads(p.read_text())["results"]["world_size"]): json.loads(p.read_text())
            for p in (tmp_path / "results").glob("scaling-n*.json")}
    assert sorted(recs) == [1, 2], sorted(recs)
    two = recs[2]["results"]
    assert (two["nodes"], two["processes_per_node"], two["backend"]) == (2, 1, "gloo"), two
    f, out = audit(tmp_path, 1)
    m = f["baseline/measured_scaling_efficiency"]
    assert m["source"].startswith("recorded") and "scaling-n1.json" in m["source"] and "scaling-n2.json" in m["source"]
    assert "on 1 -> 2 nodes" in m["message"] and "stop rule (60%) says" in m["message"], m["message"]
    assert m["value"] == pytest.approx(recs[1]["results"]["step_s"] / two["step_s"])
    # the staged curve as chapter 1 shows it (chapters.baseline.curve_table)
    from preflight.core.numfmt import percent

    rule = "stop rule (60%)"
    curve = next(t for t in html_tables(notebook_text(out, "baseline")) if t and rule in t[0])
    rows = {r[curve[0].index("GPUs")]: dict(zip(curve[0], r)) for r in curve[1:]}
    assert rows["2"]["curve from"] == "measured" and rows["1"]["curve from"] == "measured", rows
    # gpu: auto on a CPU: no peak, so the ring arithmetic on the stated step, labelled so
    assert rows["8"]["curve from"].startswith(("step model", "ring arithmetic")), rows["8"]
    assert rows["8"][rule] == "— (model only)", rows["8"]
    eff = m["value"]
    assert rows["2"][rule] == ("stop" if eff < 0.6 else "go on"), rows["2"]
    assert rows["2"]["efficiency, measured"] == percent(eff), rows["2"]
    result = {"efficiency_2_nodes": round(eff, 3), "step_s": [recs[1]["results"]["step_s"], two["step_s"]],
              "jobs_s": round(jobs_s, 1), "test_s": round(time.monotonic() - t0, 1)}
    _save(tmp_path_factory, "slurm_nodes_scaling", result)
    _report(capsys, f"staged scaling 1 -> 2 Slurm nodes: efficiency {eff:.0%} "
                    f"({result['step_s'][0] * 1e3:.1f} -> {result['step_s'][1] * 1e3:.1f} ms), jobs {jobs_s:.0f} s")


def test_allreduce_sweep_across_nodes_in_chapter_3(cluster, tmp_path, tmp_path_factory, capsys):
    """The sweep over 2 nodes (srun + torchrun) next to the README's single-node one, in chapter 3,
    which says both "nodes" share a host (read from the record's host names)."""
    t0 = time.monotonic()
    _, jobs_s = run_lines(cluster, tmp_path, "preflight.bench.allreduce")
    one = next(c for c in readme_blocks()[0] if "preflight.bench.allreduce" in c)       # the single-node line
    env = {k: v for k, v in cluster.env.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    r = subprocess.run(["bash", "-c", as_on_this_box(one)], cwd=tmp_path, env=dict(env, PET_MASTER_PORT=str(free_port())),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    across = json.loads((tmp_path / "results" / "allreduce-n2-nodes2.json").read_text())["results"]
    assert (across["nodes"], across["slurm_nodes"], len(across["hosts"])) == (2, ["n1", "n2"], 1), across
    f, out = audit(tmp_path, 3)
    a, s = f["communication/measured_busbw_across_nodes"], f["communication/measured_busbw"]
    assert "allreduce-n2-nodes2.json" in a["source"] and "allreduce-n2.json" in s["source"], (a["source"], s["source"])
    assert "share one host" in a["message"] and "on one node (2 ranks)" in a["message"], a["message"]
    assert "allreduce_nodes" in " ".join(p.name for p in (out / "charts").glob("*.svg"))
    peak = max(row["busbw_GBps"] for row in across["rows"])
    assert a["value"] == pytest.approx(peak)
    result = {"peak_busbw_GBps_2_nodes": round(peak, 3), "peak_busbw_GBps_1_node": round(s["value"], 3),
              "jobs_s": round(jobs_s, 1), "test_s": round(time.monotonic() - t0, 1)}
    _save(tmp_path_factory, "slurm_nodes_allreduce", result)
    _report(capsys, f"all-reduce across 2 Slurm nodes (one host): peak busbw {peak:.2f} GB/s "
                    f"(one node {s['value']:.2f} GB/s), job {jobs_s:.0f} s")


def test_elastic_shrink_across_nodes_in_chapter_5(cluster, tmp_path, tmp_path_factory, capsys):
    """torchrun --nnodes=1:2 under srun on n1 and n2; n2's agent killed: world 2 -> 1 from the newest
    checkpoint, no sample lost or repeated, bitwise on both sides of the change; chapter 5 reads it."""
    t0 = time.monotonic()
    _, jobs_s = run_lines(cluster, tmp_path, "preflight.bench.elastic --shrink")
    rec = json.loads((tmp_path / "results" / "elastic_shrink.json").read_text())
    r = rec["results"]
    assert r["launcher"].startswith("srun, 2 Slurm nodes"), r["launcher"]
    assert (r["world_before"], r["world_after"], r["killed_node"], r["survivor_node"]) == (2, 1, "n2", "n1"), r
    every = r["config"]["ckpt_every"]
    assert r["resumed_from"] == r["killed_after_step"] // every * every            # the newest checkpoint
    assert r["steps_lost"] == r["killed_after_step"] - r["resumed_from"]
    assert (r["samples_lost"], r["samples_repeated"], r["same_order_as_uninterrupted"]) == (0, 0, True), r
    assert r["before_change_equal"] and r["after_change_equal"], r
    assert r["final_loss_equal_to_uninterrupted"] is False            # another global batch: another trajectory
    assert 0 < r["recovery_s"] < 120
    f, _ = audit(tmp_path, 5)
    e = f["fault_tolerance/elastic_shrink_recovery_s"]
    assert e["verdict"] == "pass" and "elastic_shrink.json" in e["source"] and e["value"] == r["recovery_s"], e
    assert "world size 1 (was 2)" in e["message"], e["message"]
    result = {k: r[k] for k in ("recovery_s", "restart_s", "steps_lost", "killed_after_step", "resumed_from",
                                "samples_trained")} | {"job_s": round(jobs_s, 1), "test_s": round(time.monotonic() - t0, 1)}
    _save(tmp_path_factory, "slurm_nodes_elastic", result)
    _report(capsys, f"elastic shrink on 2 Slurm nodes: world 2 -> 1, recovery {r['recovery_s']:.1f} s, "
                    f"{r['steps_lost']} steps lost, 0 samples lost / repeated, job {jobs_s:.0f} s")


# 90 s of steps plus the start: longer than the 60-90 s an allocation of 2 min runs before Slurm's
# signal (@30 arrives 30-60 s before the limit), so the first allocation is always stopped
STEPS, CKPT_EVERY, STEP_SLEEP, SEED = 36, 5, 2.5, 3
TIME_MIN, SIGNAL_S = 2, 30


def test_walltime_requeue_on_two_nodes(cluster, tmp_path, tmp_path_factory, capsys):
    """walltime_requeue.sbatch --nodes=2: USR1 to the batch shell, the stop file seen by the workers on
    n1 and n2 (rank 0 looks, every rank learns), one complete checkpoint, requeue, the next allocation
    on 2 nodes resumes from it, final losses bitwise equal to an uninterrupted 2-rank run."""
    ckpt, out_file = tmp_path / "ckpt", tmp_path / "job.out"
    train_args = f"--steps {STEPS} --ckpt-every {CKPT_EVERY} --seed {SEED}"
    t0 = time.monotonic()
    job = cluster.submit(SBATCH, "--nodes=2", f"--time={TIME_MIN}", f"--signal=B:USR1@{SIGNAL_S}",
                         f"--output={out_file}", f"--chdir={tmp_path}", "--job-name=preflight-requeue-2n",
                         env={"CKPT_DIR": str(ckpt), "PYTHON": sys.executable, "NPROC": "1",
                              "RDZV_PORT": str(free_port()), "TRAIN_ARGS": f"{train_args} --step-sleep {STEP_SLEEP}"})
    state = cluster.wait(job, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY"}, timeout=600)
    round_trip = time.monotonic() - t0
    text = out_file.read_text() if out_file.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job}: {state}\n{text}\n{cluster.diagnostics()}"
    allocs = _allocations(text)
    assert len(allocs) >= 2 and [a["restart"] for a in allocs] == list(range(len(allocs))), text
    assert text.count("nodes=2 master=127.0.0.1:") == len(allocs), text       # every allocation: both nodes
    for a in allocs[:-1]:
        assert a["usr1"] is not None and a["rc"] == 0 and a["requeued"], text

    events = [json.loads(ln) for ln in (ckpt / "train.jsonl").read_text().splitlines() if '"event"' in ln]
    starts = [e for e in events if e["event"] == "start"]
    assert [e["world"] for e in starts] == [2] * len(allocs), starts
    stops = [e for e in events if e["event"] == "stopped"]
    saves = [e for e in events if e["event"] == "checkpoint"]
    assert len(stops) == 2 * (len(allocs) - 1), stops               # both ranks, every stopped allocation
    for i in range(len(allocs) - 1):
        pair = stops[2 * i:2 * i + 2]
        # (the c10d rendezvous, not the node, decides which rank runs where)
        assert sorted(e["rank"] for e in pair) == [0, 1] and sorted(e["node"] for e in pair) == ["n1", "n2"], pair
        step = pair[0]["step"]
        assert pair[1]["step"] == step and [s["step"] for s in saves].count(step) == 1, (pair, saves)
        assert starts[i + 1]["resumed_from"] == step           # loaded (checksums verified) by the next one
    assert (ckpt / "DONE").exists()

    ref = tmp_path / "ref"
    env = {k: v for k, v in cluster.env.items() if not k.startswith("SLURM_")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "preflight.harness.trainloop", "--ckpt-dir", str(ref / "ckpt"), *train_args.split(),
                        "--losses", str(ref / "losses.jsonl")], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got, want = _losses(ckpt / "train.jsonl"), _losses(ref / "losses.jsonl")
    assert sorted(got) == sorted(want) and max(want) == STEPS
    assert got == want, "losses after the requeue differ from the uninterrupted 2-rank run"
    result = {"round_trip_s": round(round_trip, 1), "allocations": len(allocs),
              "stop_steps": [s["step"] for s in stops[::2]], "stop_every": [s["stop_every"] for s in stops],
              "requeue_gap_s": [round(b["start"] - a["exit"], 1) for a, b in zip(allocs, allocs[1:])],
              "final_loss_hex": got[STEPS]}
    _save(tmp_path_factory, "slurm_nodes_requeue", result)
    _report(capsys, f"walltime requeue on 2 Slurm nodes: round trip {round_trip:.0f} s, {len(allocs)} allocations, "
                    f"requeue gaps {result['requeue_gap_s']} s, stopped at steps {result['stop_steps']}")


def test_trace_summaries_read_where_the_traces_are(cluster, tmp_path, tmp_path_factory, capsys):
    """The README's line: one task per node reads its share of the job's traces into per-rank
    summaries; `traces` on the summaries gives the verdicts it gives on the traces themselves."""
    import shutil

    traces = tmp_path / "traces"
    traces.mkdir()
    for p in (REPO / "data" / "traces" / "example").glob("*.json.gz"):
        shutil.copy(p, traces / p.name)
    lines, jobs_s = run_lines(cluster, tmp_path, "trace_summaries.sbatch")
    out = next(tmp_path.glob("preflight-traces-*.out")).read_text()
    assert "task 0 on n1: 1 of 2 trace files" in out and "task 1 on n2: 1 of 2 trace files" in out, out
    summaries = sorted(p.name for p in (tmp_path / "results" / "trace-summaries").iterdir())
    assert summaries == ["rank-0.summary.json", "rank-1.summary.json"], summaries
    merged = json.loads(run_cli("traces", "results/trace-summaries/", "--json", cwd=tmp_path).stdout)
    direct = json.loads(run_cli("traces", "traces/", "--json", cwd=tmp_path).stdout)
    strip = (lambda fs: [{k: v for k, v in f.items() if k != "source"} for f in fs])
    assert strip(merged["findings"]) == strip(direct["findings"]) and merged["ranks_read"] == [0, 1]
    _save(tmp_path_factory, "slurm_nodes_traces", {"jobs_s": round(jobs_s, 1)})
    _report(capsys, f"trace summaries on 2 Slurm nodes: {len(summaries)} ranks in {jobs_s:.0f} s")
