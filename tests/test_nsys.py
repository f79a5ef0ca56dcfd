"""Nsight Systems exports (``nsys export --type sqlite``) read by ``python -m preflight traces DIR``:
the shared real captures and nsys-ai's labelled cases (../shared/nsys, MIT), small exports built here
for each mechanism (steps from NVTX, CPU events split per GPU, a collective named by its NVTX range,
FLOPs from ``emit_nvtx`` shapes), the bad inputs (exit 2, the file named), ``compare`` on two nsys
audits and the README's commands."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from conftest import REPO
from preflight.chapters import traces as T
from preflight.diagnose import nsys_job
from preflight.diagnose.nsys_file import read_export
from preflight.diagnose.trace_analysis import analyze
from preflight.diagnose.trace_file import TraceError

PY = sys.executable
SHARED = REPO.parent / "shared" / "nsys"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/nsys is not beside the project")
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_CACHE", str(tmp_path / "cache"))


def run(*args, cwd=None):
    return subprocess.run([PY, "-m", "preflight", *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ})


def folder_of(tmp_path, *names, sub="job"):
    """A folder holding copies of shared exports (and their licence)."""
    d = tmp_path / sub
    d.mkdir()
    for n in names:
        shutil.copy(SHARED / n, d / n)
    shutil.copy(SHARED / "LICENSE", d / "LICENSE")
    return d


def findings_of(folder, gpu=None):
    a = T.audit_traces(folder, gpu_key=gpu)
    return a, {f.id: f for f in T.findings(a)}


# --- a tiny export builder ------------------------------------------------------------------------------

PID = 1 << 24                     # GlobalId: the process in bits 24 and up (globalPid = pid << 24)


class Export:
    """The tables a reader uses, in Nsight Systems' column names; times in ns."""

    def __init__(self, version="3.25.0", gpus=(H100,), suffix=""):
        self.rows = {"k": [], "r": [], "m": [], "n": []}
        self.strings, self.corr, self.version, self.gpus, self.sfx = {}, 0, version, gpus, suffix

    def sid(self, s):
        return self.strings.setdefault(s, len(self.strings) + 1)

    def kernel(self, name, start, dur, dev=0, proc=1, launch=None, stream=7, call="cudaLaunchKernel_v7000"):
        self.corr += 1
        self.rows["k"].append((start, start + dur, dev, stream, self.corr, proc * PID, self.sid(name), self.sid(name[:20])))
        lt = start - 5_000 if launch is None else launch
        self.rows["r"].append((lt, lt + 2_000, proc * PID + proc, self.corr, self.sid(call)))
        return self

    def call(self, name, start, proc=1, dur=1_000):
        self.corr += 1
        self.rows["r"].append((start, start + dur, proc * PID + proc, self.corr, self.sid(name)))
        return self

    def copy(self, start, dur, kind=1, src=0, dst=2, nbytes=1 << 20, dev=0, proc=1):
        self.corr += 1
        self.rows["m"].append((start, start + dur, dev, 7, self.corr, proc * PID, nbytes, kind, src, dst))
        self.rows["r"].append((start - 3_000, start - 1_000, proc * PID + proc, self.corr, self.sid("cudaMemcpyAsync_v3020")))
        return self

    def nvtx(self, text, start, end, proc=1):
        self.rows["n"].append((start, end, 59, text, proc * PID + proc))
        return self

    def write(self, path):
        db = sqlite3.connect(path)
        s = self.sfx
        db.executescript(f"""
            CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL{s} (start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER,
                correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, shortName INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, "end" INTEGER, globalTid INTEGER,
                correlationId INTEGER, nameId INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, "end" INTEGER, deviceId INTEGER, streamId INTEGER,
                correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER, srcKind INTEGER, dstKind INTEGER);
            CREATE TABLE NVTX_EVENTS (start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER);
            CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT);""")
        db.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                       [("EXPORT_SCHEMA_VERSION", self.version), ("EXPORT_PRODUCT_VERSION", "2026.2.1.210")])
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in self.strings.items()])
        for t, rows in (("CUPTI_ACTIVITY_KIND_KERNEL" + s, "k"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "r"),
                        ("CUPTI_ACTIVITY_KIND_MEMCPY", "m"), ("NVTX_EVENTS", "n")):
            if self.rows[rows]:
                db.executemany(f"INSERT INTO {t} VALUES ({', '.join('?' * len(self.rows[rows][0]))})", self.rows[rows])
        db.executemany("INSERT INTO TARGET_INFO_GPU VALUES (?, ?)", list(enumerate(self.gpus)))
        db.commit()
        db.close()
        return path


GEMM = "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x256_32x3_nn_align8>(Params)"
ELEM = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, ...)"
ALLREDUCE = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096UL>)"


def two_ranks_three_steps(ar_dur=(100_000, 400_000)):
    """Two processes, GPU 0 and GPU 1, three ProfilerStep ranges of 1 ms each; in each step a GEMM, an
    all-reduce (ncclDevKernel_Generic, launched inside nccl:all_reduce) and a cudaStreamSynchronize."""
    e = Export(gpus=(H100, H100))
    for proc, dev in ((1, 0), (2, 1)):
        for k in range(3):
            t0 = 1_000_000 * (k + 1)
            e.nvtx(f"ProfilerStep#{k + 4}", t0, t0 + 1_000_000, proc=proc)
            e.kernel(GEMM, t0 + 100_000, 300_000, dev=dev, proc=proc)
            e.nvtx("nccl:all_reduce, op_id = 7", t0 + 390_000, t0 + 420_000, proc=proc)
            e.kernel(ALLREDUCE, t0 + 420_000, ar_dur[dev], dev=dev, proc=proc, launch=t0 + 400_000, stream=20)
            e.call("cudaStreamSynchronize_v3020", t0 + 950_000, proc=proc)
    return e


# --- mechanisms, on exports built here ----------------------------------------------------------------------

def test_one_rank_per_gpu_and_the_cpu_side_split_by_thread(tmp_path):
    events, info = read_export(two_ranks_three_steps().write(tmp_path / "job.sqlite"))
    assert [ev.meta["nsys"]["device"] for ev in events] == [0, 1] and info["schema"] == "3.25.0"
    for ev in events:
        assert len(ev.gpu["ts"]) == 6 and len(ev.steps) == 3 and ev.meta["devices"] == [H100]
        assert ev.runtime["name"].count("cudaStreamSynchronize_v3020") == 3       # its own process's calls only
        assert [s["num"] for s in ev.steps] == [4, 5, 6]
        colls = [a for a in ev.gpu["args"] if a]
        assert colls == [{"Collective name": "all_reduce"}] * 3                 # from nccl:all_reduce, not the name


def test_the_nvtx_step_window_and_the_late_rank(tmp_path):
    two_ranks_three_steps().write(tmp_path / "job.sqlite")
    a, f = findings_of(tmp_path)
    for r in (0, 1):
        s = a["summaries"][r]
        assert s["window"]["steps"] == 2 and s["window"]["basis"].startswith("NVTX step ranges: 2 of 3 steps")
        assert s["window"]["gpu_events"] == 4                                 # the last step's launches are out
        assert s["comm"]["by_type"]["all_reduce"]["count"] == 2
        assert a["ranks"][r]["sync_per_step"] == 1.0
    assert a["cross"]["wait"]["matched"] == 2 and a["cross"]["wait"]["last"] == {0: 2, 1: 0}
    assert a["ranks"][1]["wait_share"] == pytest.approx(2 * 300_000 / a["summaries"][1]["gpu"]["span_ns"])
    assert f["load_balance/trace_collective_wait"].verdict == "fail"
    assert "numbered by file name then device id" in a["quality"][0]["limits"][-1]


def test_flops_from_emit_nvtx_shapes_and_the_dtype_from_the_gemm_names(tmp_path):
    e = Export()
    for k in range(3):
        t0 = 1_000_000 * (k + 1)
        e.nvtx(f"step {k}", t0, t0 + 1_000_000)
        e.nvtx("aten::mm, seq = 3, op_id = 9, sizes = [[4096, 4096], [4096, 4096]], input_op_ids = [(1, 0), (2, 0)]",
               t0 + 10_000, t0 + 20_000)
        e.kernel(GEMM, t0 + 100_000, 800_000)
    e.write(tmp_path / "rank0.sqlite")
    a, f = findings_of(tmp_path)
    s = a["summaries"][0]
    assert s["flops"]["total"] == 2 * 2 * 4096**3 and s["flops"]["by_peak_dtype"] == {"bf16": 2 * 2 * 4096**3}
    assert s["window"]["basis"].startswith("NVTX step ranges") and a["ranks"][0]["chip_source"] == "trace"
    span = s["gpu"]["span_ns"] * 1e-9
    assert f["baseline/trace_mfu"].value == pytest.approx(2 * 2 * 4096**3 / span / 1e12 / a["ranks"][0]["peak_tflops"])


def test_copies_named_as_kineto_names_them_and_a_table_suffix(tmp_path):
    e = Export(suffix="_V2").kernel(ELEM, 100_000, 50_000)
    e.copy(200_000, 10_000, kind=1, src=0).copy(300_000, 10_000, kind=1, src=1).copy(400_000, 10_000, kind=2, src=2, dst=0)
    events, _ = read_export(e.write(tmp_path / "x.sqlite"))
    assert events[0].gpu["name"][1:] == ["Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)",
                                         "Memcpy DtoH (Device -> Pageable)"]
    a, f = findings_of(tmp_path)
    assert a["ranks"][0]["h2d"]["pageable"]["count"] == 1 and a["ranks"][0]["h2d"]["pinned"]["count"] == 1
    assert f["data_pipeline/trace_pageable_h2d"].verdict == "warn"


def test_rows_that_end_before_they_start_are_counted_not_dropped_in_silence(tmp_path):
    e = Export().kernel(ELEM, 100_000, 50_000).kernel(ELEM, 300_000, 50_000)
    e.rows["k"].append((500_000, 400_000, 0, 7, 99, PID, e.sid(ELEM), e.sid("x")))
    e.write(tmp_path / "x.sqlite")
    job = nsys_job.read_job(tmp_path)
    assert job["ranks"][0]["window"]["gpu_events"] == 2
    assert any("1 rows of CUPTI_ACTIVITY_KIND_KERNEL" in n and "left out" in n for n in job["notes"])


def test_ranks_from_file_names_when_each_export_is_one_rank(tmp_path):
    for r in (3, 5):
        Export().kernel(ELEM, 100_000, 50_000).write(tmp_path / f"job_rank{r}.sqlite")
    job = nsys_job.read_job(tmp_path)
    assert sorted(job["ranks"]) == [3, 5] and job["world_size"] is None
    assert job["ranks"][5]["meta"]["rank_source"].startswith("the file's name")


# --- the shared captures ----------------------------------------------------------------------------------

@needs_shared
def test_mfu_capture_reproduces_nsys_ai_kernel_and_nccl_figures(tmp_path):
    """Upstream's published figures (docs/user/reading-a-diff.md) where the definitions agree: kernel time
    535.20 ms, NCCL (all SendRecv) 25.40 ms, none of it under compute; the kernel span per GPU."""
    a, f = findings_of(folder_of(tmp_path, "mfu_2gpu_before.sqlite"), gpu="h100")
    g = {r: s["gpu"] for r, s in a["summaries"].items()}
    kernels = {r: sum(x["classes"][c]["ns"] for c in ("matmul", "memory", "comm")) for r, x in g.items()}
    assert kernels == {0: 270_875_926, 1: 264_324_724} and sum(kernels.values()) / 1e6 == pytest.approx(535.20, abs=0.005)
    assert {r: x["comm_ns"] for r, x in g.items()} == {0: 17_172_652, 1: 8_229_100}
    assert all(x["overlap_ns"] == 0 for x in g.values())
    assert {r: x["span_ns"] for r, x in g.items()} == {0: 299_848_812, 1: 298_661_551}
    # idle counts copies as GPU work: nsys-ai's kernel-only 28.97 + 34.34 ms less the copies between kernels
    assert {r: x["idle_ns"] for r, x in g.items()} == {0: 26_031_025, 1: 31_385_635}
    assert {r: x["classes"]["copy"]["ns"] for r, x in g.items()} == {0: 2_954_303, 1: 2_951_192}
    # 64 of 66 SendRecv kernels were launched inside nccl:all_to_all: all-to-all, matched across the two GPUs
    for r in (0, 1):
        assert a["summaries"][r]["comm"]["by_type"]["all_to_all"]["count"] == 32
    assert a["cross"]["wait"]["matched"] == 32 and a["ranks"][0]["wait_share"] > a["ranks"][1]["wait_share"]
    assert a["cross"]["wait"]["last"] == {0: 10, 1: 22} and a["cross"]["wait"]["wait_ns"][0] == pytest.approx(11.4e6, abs=0.05e6)
    assert f["communication/trace_comm_overlap"].verdict == "fail" and f["communication/trace_exposed_comm"].value > 0
    assert f["baseline/trace_gpu_idle"].verdict == "warn" and f["baseline/trace_mfu"].verdict == "info"
    q = a["quality"][0]
    assert q["window"].startswith("the whole capture") and q["device"] is None
    assert any("no TARGET_INFO_GPU" in n for n in a["notes"])


@needs_shared
def test_h100_capture_two_gpus_busy_copying_and_no_nccl(tmp_path):
    a, f = findings_of(folder_of(tmp_path, "h100_2gpu_1s.sqlite"))
    assert sorted(a["ranks"]) == [0, 1]
    g = {r: s["gpu"] for r, s in a["summaries"].items()}
    assert {r: x["compute_ns"] for r, x in g.items()} == {0: 22_385_163, 1: 22_444_359}       # README: 22.39, 22.44 ms
    assert all(x["classes"]["copy"]["ns"] > 0.9 * x["span_ns"] for x in g.values())           # pinned H2D copies
    assert {r: (x["span_ns"], x["idle_ns"]) for r, x in g.items()} == {0: (969_447_605, 6_557_358),
                                                                      1: (969_258_578, 6_447_873)}
    assert all(a["ranks"][r]["compute"] < 0.03 for r in (0, 1))
    assert f["communication/trace_exposed_comm"].verdict == "info"                          # no NCCL in this window
    assert {r: a["summaries"][r]["data"]["sync_calls"] for r in (0, 1)} == {0: {"cudaStreamSynchronize_v3020": 4},
                                                                           1: {"cudaStreamSynchronize_v3020": 4}}


# nsys-ai's label categories -> the finding ids that say the same thing here
CATEGORY = {"idle": ["baseline/trace_gpu_idle"],
            "communication": T.IDS["communication"] + ["load_balance/trace_collective_wait"]}
SEVERITY = {"warning": ("warn", "fail"), "critical": ("fail",)}


@needs_shared
@pytest.mark.parametrize("case", ["healthy_1pct", "mock"])
def test_nsys_ai_labels_where_they_state_an_answer(tmp_path, case):
    label = json.loads((SHARED / "labels" / f"{case}.json").read_text())
    a, f = findings_of(folder_of(tmp_path, f"{case}.sqlite"))
    g = a["summaries"][0]["gpu"]
    assert (g["span_ns"], g["idle_ns"]) == {"healthy_1pct": (403_990_000, 3_990_000), "mock": (22_453_059, 22_447_298)}[case]
    checked = 0
    for rule in label["must_not"]:
        bad = SEVERITY.get(rule.get("min_severity", "warning"))
        for fid in CATEGORY[rule["category"]]:
            assert fid not in f or f[fid].verdict not in bad, (rule, f[fid])
        checked += 1
    for rule in label["expect"]:
        if rule.get("required") and rule["category"] in CATEGORY:
            assert any(f[i].verdict in SEVERITY[rule["min_severity"]] for i in CATEGORY[rule["category"]] if i in f)
            checked += 1
    assert checked == len(label["must_not"]) + sum(1 for r in label["expect"] if r.get("required"))


@needs_shared
def test_the_healthy_capture_raises_no_warning_at_all(tmp_path):
    a, f = findings_of(folder_of(tmp_path, "healthy_1pct.sqlite"))
    assert [i for i, x in f.items() if x.verdict in ("warn", "fail")] == []
    v = a["ranks"][0]
    assert a["summaries"][0]["window"]["gpu_events"] == 400 and 0.005 < v["idle"] < 0.015
    assert v["compute"] > 0.98                                    # label: compute-bound (not gated upstream)


# --- bad input: exit 2, the file named --------------------------------------------------------------------

def _bad(tmp_path, name, data=None, build=None):
    d = tmp_path / "bad"
    d.mkdir()
    if build:
        build(d / name)
    else:
        (d / name).write_bytes(data)
    r = run("traces", d)
    assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr, r.stderr
    return r.stderr


@needs_shared
def test_a_truncated_export_exits_2_naming_it(tmp_path):
    raw = (SHARED / "mock.sqlite").read_bytes()
    err = _bad(tmp_path, "rank0.sqlite", raw[: len(raw) // 2])
    assert "truncated" in err


@needs_shared
def test_a_damaged_export_exits_2_naming_it(tmp_path):
    raw = bytearray((SHARED / "mock.sqlite").read_bytes())
    raw[100:4096] = b"\xff" * (4096 - 100)                       # the schema page overwritten, same size
    assert "rank0.sqlite" in _bad(tmp_path, "rank0.sqlite", bytes(raw))


def test_not_sqlite_missing_tables_and_an_unknown_schema_exit_2(tmp_path):
    assert "not an SQLite file" in _bad(tmp_path, "a.sqlite", b"{}" * 100)

    def no_kernels(p):
        db = sqlite3.connect(p)
        db.executescript("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);"
                         "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.25.0');")
        db.close()
    shutil.rmtree(tmp_path / "bad")
    assert "no CUPTI_ACTIVITY_KIND_KERNEL table" in _bad(tmp_path, "b.sqlite", build=no_kernels)

    def other_db(p):
        sqlite3.connect(p).executescript("CREATE TABLE runs (id INTEGER);")
    shutil.rmtree(tmp_path / "bad")
    assert "no META_DATA_EXPORT" in _bad(tmp_path, "c.sqlite", build=other_db)
    shutil.rmtree(tmp_path / "bad")
    err = _bad(tmp_path, "d.sqlite", build=lambda p: Export(version="2.1").kernel(ELEM, 0, 10).write(p))
    assert "EXPORT_SCHEMA_VERSION = '2.1'" in err


def test_a_report_without_its_export_gets_the_command(tmp_path):
    err = _bad(tmp_path, "rank0.nsys-rep", b"\0" * 64)
    assert "nsys export --type sqlite --output rank0.sqlite rank0.nsys-rep" in err


def test_a_report_beside_its_export_is_skipped_and_a_mixed_folder_is_refused(tmp_path):
    Export().kernel(ELEM, 100_000, 50_000).write(tmp_path / "rank0.sqlite")
    (tmp_path / "rank0.nsys-rep").write_bytes(b"\0" * 64)
    job = nsys_job.read_job(tmp_path)
    assert list(job["ranks"]) == [0] and any("rank0.nsys-rep: skipped" in n for n in job["notes"])
    (tmp_path / "rank1.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceError, match="one format per folder"):
        nsys_job.read_job(tmp_path)


def test_one_bad_export_among_good_ones_is_named_in_the_quality_table(tmp_path):
    Export().kernel(ELEM, 100_000, 50_000).write(tmp_path / "rank0.sqlite")
    (tmp_path / "rank1.sqlite").write_bytes(b"garbage" * 20)
    a = analyze(nsys_job.read_job(tmp_path))
    assert list(a["ranks"]) == [0]
    assert [q["file"] for q in a["quality"] if q["rank"] is None] == ["rank1.sqlite"]


# --- compare on two nsys audits, and the README ------------------------------------------------------------

@needs_shared
def test_compare_two_nsys_audits(tmp_path):
    before, after = folder_of(tmp_path, "mock.sqlite", sub="before"), folder_of(tmp_path, "healthy_1pct.sqlite", sub="after")
    for name, d in (("before", before), ("after", after)):
        r = run("audit", REPO / "data/profiles/example.yaml", "--plan-only", "--chapters", "1", "--traces", d,
                "--out", tmp_path / f"rep-{name}")
        assert r.returncode == 0, r.stderr[-2000:]
    r = run("compare", tmp_path / "rep-before", tmp_path / "rep-after")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "baseline/trace_gpu_idle" in ln)
    assert "fail" in line and "pass" in line and "improved" in line


def _readme_block() -> list[str]:
    import re

    text = (REPO / "README.md").read_text().split("### Nsight Systems exports", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", text, re.S)[0]
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in block.splitlines() if ln.strip()]


@needs_shared
def test_readme_nsys_commands_as_written(tmp_path):
    """The export line's output folder is the one `traces` reads, and its form is the command a lone report
    is answered with; the `traces` line runs as written on a real 2-GPU export put there."""
    import shlex

    lines = _readme_block()
    export = next(ln for ln in lines if ln.startswith("nsys export"))
    traces = next(ln for ln in lines if ln.startswith("python -m preflight traces"))
    argv = shlex.split(export)
    out = argv[argv.index("--output") + 1]
    folder = shlex.split(traces)[4]
    assert os.path.dirname(out) == folder.rstrip("/")
    (tmp_path / folder).mkdir(parents=True)
    report = tmp_path / folder / argv[-1]
    report.write_bytes(b"\0" * 64)
    r = run("traces", folder, cwd=tmp_path)
    assert r.returncode == 2 and f"nsys export --type sqlite --output {os.path.basename(out)} {argv[-1]}" in r.stderr
    report.unlink()
    shutil.copy(SHARED / "mfu_2gpu_before.sqlite", tmp_path / out)
    r = subprocess.run([PY if a == "python" else a for a in shlex.split(traces)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "rank    1" in r.stdout and "communication/trace_exposed_comm" in r.stdout, r.stderr
