"""``python -m preflight hang DIR``: which rank hung the job, from every rank's Flight Recorder dump.

The two shared cases (../shared/flight-recorder/: a 16-rank Megatron MoE job, TP4 PP2 EP8, a fault
injected into ranks 9 and 14) against their published answers, read from the files beside them; jobs of
other layouts simulated here (:class:`Job`: every rank runs the same program of collectives, launches
ahead of completion up to a window, and blocks where a peer never launches), their dumps built as plain
dicts and pickled; a healthy job (nobody blamed); a hang inside a collective every rank launched (nobody
blamed either); malformed input (exit 2, the file named, nothing executed)."""
import json
import os
import pickle
import re
import subprocess
import sys

import pytest

from conftest import REPO
from preflight.core.findings import Finding
from preflight.diagnose.flight_recorder import analyse_folder, hang_finding, ranks_text
from preflight.diagnose.flight_recorder_dump import DumpError

PY = sys.executable
SHARED = REPO.parent / "shared" / "flight-recorder"
CASES = ["gpu_error_2nd", "lock_gil_1st"]
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason="../shared/flight-recorder is absent (CI keeps it beside the clone)")


def hang(*args, cwd=REPO):
    return subprocess.run([PY, "-m", "preflight", "hang", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


# --- a simulated job: groups of a Megatron-like layout, a program of collectives, async launches --------------

class Job:
    """``world = tp * dp * pp`` ranks, rank = (stage * dp + d) * tp + t. Groups, created in this order on every
    rank (global names count up; each rank's local ids count up over its own groups, with gaps): the default
    group, TP, DP, EP (``ep`` consecutive ranks of a stage), and one pipeline pair group per adjacent stages.
    Each step: recv from the previous stage, per layer a TP all-reduce and two EP all-to-alls, send to the next
    stage, a DP all-reduce of the gradients. A rank launches op i once its ops before i - ``window`` are done;
    an op of a group completes when every member launched it (and none had stopped executing)."""

    def __init__(self, tp=1, pp=1, dp=1, ep=1, steps=3, layers=2, window=3, buffer=12):
        self.world, self.window, self.buffer = tp * pp * dp, window, buffer
        stage = {r: r // (tp * dp) for r in range(self.world)}
        groups = [("default_pg", list(range(self.world)))]
        groups += [("TENSOR_MODEL_PARALLEL_GROUP", [(p * dp + d) * tp + t for t in range(tp)])
                   for p in range(pp) for d in range(dp)]
        groups += [("DATA_PARALLEL_GROUP", [(p * dp + d) * tp + t for d in range(dp)]) for p in range(pp) for t in range(tp)]
        groups += [("EXPERT_MODEL_PARALLEL_GROUP", list(range(p * tp * dp + i, p * tp * dp + i + ep)))
                   for p in range(pp) for i in range(0, tp * dp, ep)]
        groups += [("PIPELINE_P2P_GROUP", [(p * dp + d) * tp + t, ((p + 1) * dp + d) * tp + t])
                   for p in range(pp - 1) for d in range(dp) for t in range(tp)]
        self.groups = {str(i * 3 + 1): g for i, g in enumerate(groups)}          # global names: 1, 4, 7, ...
        mine = {r: [n for n, (_, ranks) in self.groups.items() if r in ranks] for r in range(self.world)}
        self.local = {r: {n: 2 * i + 1 for i, n in enumerate(names)} for r, names in mine.items()}
        self.program = {}
        for r in range(self.world):
            def grp(desc, other=None, r=r):
                return next(n for n in mine[r] if self.groups[n][0] == desc and (other is None or other in self.groups[n][1]))
            ops, s = [], stage[r]
            for _ in range(steps):
                if s > 0:
                    ops.append((grp("PIPELINE_P2P_GROUP", r - tp * dp), f"nccl:recv {1}<-{0}", [[64, 512]], "BFloat16", True))
                for _ in range(layers):
                    if tp > 1:
                        ops.append((grp("TENSOR_MODEL_PARALLEL_GROUP"), "nccl:all_reduce", [[64, 512]], "BFloat16", False))
                    if ep > 1:
                        ops += [(grp("EXPERT_MODEL_PARALLEL_GROUP"), "nccl:all_to_all", [[128 + r, 512]], "BFloat16", False)] * 2
                if s < pp - 1:
                    ops.append((grp("PIPELINE_P2P_GROUP", r + tp * dp), f"nccl:send {0}->{1}", [[64, 512]], "BFloat16", True))
                if dp > 1:
                    ops.append((grp("DATA_PARALLEL_GROUP"), "nccl:all_reduce", [[4096]], "Float", False))
            self.program[r] = ops

    def run(self, stop_launch=None, stop_exec=None, desync=None):
        """Launch and complete until nothing moves. ``stop_launch`` {rank: i}: launches ops before i only;
        ``stop_exec`` {rank: i}: launches on, completes nothing from op i; ``desync`` {rank: (i, op)}: op i is
        another collective (its group never completes it)."""
        stop_launch, stop_exec, desync = stop_launch or {}, stop_exec or {}, desync or {}
        for r, (i, op) in desync.items():
            g, _, sizes, dt, p2p = self.program[r][i]
            self.program[r][i] = (g, op, sizes, dt, p2p)
        k_of = {r: [] for r in self.program}          # the k-th op of its group, per program op
        for r, ops in self.program.items():
            seen = {}
            for g, *_ in ops:
                seen[g] = seen.get(g, 0) + 1
                k_of[r].append(seen[g])
        bad = {(self.program[r][i][0], k_of[r][i]) for r, (i, _) in desync.items()}
        launched = {r: 0 for r in self.program}
        while True:
            count = {}           # (group, k) -> members that launched it and can run it
            for r, n in launched.items():
                for i in range(n):
                    if i < stop_exec.get(r, 10**9):
                        key = (self.program[r][i][0], k_of[r][i])
                        count[key] = count.get(key, 0) + 1
            done = {key for key, c in count.items() if c == len(self.groups[key[0]][1]) and key not in bad}
            self.done = {r: [(ops[i][0], k_of[r][i]) in done for i in range(launched[r])] for r, ops in self.program.items()}
            moved = False
            for r, ops in self.program.items():
                prefix = next((i for i, d in enumerate(self.done[r]) if not d), len(self.done[r]))
                limit = min(len(ops), stop_launch.get(r, 10**9), prefix + self.window)
                if launched[r] < limit:
                    launched[r], moved = limit, True
            if not moved:
                self.launched, self.k_of = launched, k_of
                return self

    def dump(self, r) -> dict:
        status, entries = {}, []
        for g in self.local[r]:
            idx = [i for i in range(self.launched[r]) if self.program[r][i][0] == g]
            comp = 0
            for i in idx:
                if not self.done[r][i]:
                    break
                comp += 1
            status[str(self.local[r][g])] = {"last_enqueued_collective": len(idx), "last_started_collective": -1,
                                             "last_completed_collective": comp}
        for i in range(max(0, self.launched[r] - self.buffer), self.launched[r]):
            g, op, sizes, dt, p2p = self.program[r][i]
            k = self.k_of[r][i]
            entries.append({"record_id": 1000 + i, "pg_id": self.local[r][g], "process_group": (g, self.groups[g][0]),
                            "collective_seq_id": 0 if p2p else k, "p2p_seq_id": k if p2p else 0, "op_id": k,
                            "profiling_name": op, "time_created_ns": 1_700_000_000_000_000_000 + i, "input_sizes": sizes,
                            "input_dtypes": [dt], "output_sizes": sizes, "output_dtypes": [dt], "state": "scheduled",
                            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
                            "timeout_ms": 600000, "is_p2p": p2p, "thread_name": "python", "thread_id": "1",
                            "frames": [{"name": "forward", "filename": "model.py", "line": 10 + i}]})   # 2.10's stack
        config = {g: {"name": g, "desc": self.groups[g][0], "ranks": str(self.groups[g][1])} for g in self.local[r]}
        return {"version": "2.10", "comm_lib_version": "2.27.3", "pg_config": config, "pg_status": status,
                "entries": entries}

    def write(self, folder, empty=(), drop=()):
        folder.mkdir(parents=True, exist_ok=True)
        for r in range(self.world):
            if r not in drop:
                d = self.dump(r)
                if r in empty:
                    d["entries"] = []
                (folder / f"_dump_{r}").write_bytes(pickle.dumps(d, protocol=2))
        return folder


def step_len(job, r=0):
    return len(job.program[r]) // 3


# --- the shared cases: the published answers ----------------------------------------------------------------

def _reference(case):
    """(pg, desc, op, size, dtype, missing ranks) from upstream's reference table, and the injected ranks."""
    row = (SHARED / "reference_outputs" / f"{case}_reference.txt").read_text().splitlines()[1]
    pg, desc, op, size, dtype, missing = (c.strip() for c in row.split("|"))
    injected = json.loads(re.search(r"Fault ranks: (\[.*\])", (SHARED / case / "fault_injection.log").read_text())[1])
    return pg, desc.split(",")[0], op, size, dtype, sorted(map(int, missing.split(","))), sorted(injected)


@needs_shared
@pytest.mark.parametrize("case", CASES)
def test_shared_cases_give_the_published_answer(case):
    pg, desc, op, size, dtype, missing, injected = _reference(case)
    a = analyse_folder(SHARED / case)
    assert a["likely_faulty"] == missing == injected == [9, 14]
    s = a["stopped_at"]
    assert (s["group"], s["desc"], s["op"], s["size"], s["dtype"]) == (pg, desc, op, size, dtype)
    assert s["not_enqueued"] == missing and s["not_completed"] == [8, 10, 11, 12, 13, 15]
    assert all(x["confidence"] == "high" for x in a["suspects"]) and len(a["suspects"]) == 2
    assert a["state"] == "hung" and a["skipped"] == ["fault_injection.log"]
    assert not [m for g in a["groups"] for m in g["mismatches"]]


@needs_shared
def test_lock_gil_ranks_have_empty_recorders_and_are_named_by_creation_order():
    a = analyse_folder(SHARED / "lock_gil_1st")
    assert a["empty_dumps"] == [9, 14]
    assert a["local_ids_named_by"]["creation order"] > 0        # ranks 9 and 14 have no entries to name them
    g72 = next(g for g in a["groups"] if g["name"] == "72")
    assert g72["status"]["9"] == [45264, 45264] and g72["status"]["8"] == [45267, 45264]
    assert any("holds no entries" in why for x in a["suspects"] for why in x["reasons"])


@needs_shared
def test_cli_on_a_shared_case_text_json_and_picture(tmp_path):
    r = hang(SHARED / "gpu_error_2nd", "--svg", tmp_path / "hang.svg")
    assert r.returncode == 0, r.stderr
    assert "likely faulty ranks: 9, 14" in r.stdout and "stopped at: group 72 EXPERT_MODEL_PARALLEL_GROUP" in r.stdout
    svg = (tmp_path / "hang.svg").read_text()
    assert svg.startswith("<svg") and "EXPERT_MODEL_PARALLEL_GROUP" in svg
    j = hang(SHARED / "gpu_error_2nd", "--json")
    out = json.loads(j.stdout)
    assert out["likely_faulty"] == [9, 14] and out["finding"]["id"] == "fault_tolerance/hang_attribution"
    assert out["finding"]["verdict"] == "fail" and set(out["finding"]["per_rank"]) == {"9", "14"}


@needs_shared
def test_hang_finding_is_a_finding():
    f = Finding(**hang_finding(SHARED / "gpu_error_2nd"))
    assert f.id == "fault_tolerance/hang_attribution" and f.value == 2 and f.verdict == "fail"
    assert f.per_rank == {"9": 0.9, "14": 0.9} and "ranks 9, 14 hung the job" in f.message


@needs_shared
def test_picture_cells():
    from preflight.reporting.charts import to_svg
    from preflight.reporting.hang_charts import grid_frame, progress_grid

    a = analyse_folder(SHARED / "gpu_error_2nd")
    df = grid_frame(a)
    assert len(df) == 16 * 13                         # 16 ranks x 13 kinds of group
    cell = df[(df["rank"] == 9) & (df["column"] == "EXPERT_MODEL_PARALLEL_GROUP")].iloc[0]
    assert cell["state"] == "never launched the stuck collective" and cell["behind"] == 6
    assert set(df.loc[df["state"] == "never launched the stuck collective", "rank"]) == {9, 14}
    assert "rank" in to_svg(progress_grid(a))


# --- other layouts, simulated --------------------------------------------------------------------------------

LAYOUTS = {"dense tp2 pp3 dp2": dict(tp=2, pp=3, dp=2), "moe tp1 pp2 dp4 ep4": dict(tp=1, pp=2, dp=4, ep=4),
           "moe tp2 pp2 dp2 ep2": dict(tp=2, pp=2, dp=2, ep=2)}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_healthy_job_blames_nobody(tmp_path, name):
    job = Job(**LAYOUTS[name]).run()
    assert all(job.launched[r] == len(job.program[r]) for r in job.program)
    a = analyse_folder(job.write(tmp_path / "dumps"))
    assert a["state"] == "healthy" and a["stopped_at"] is None and a["suspects"] == [] and a["likely_faulty"] == []
    f = Finding(**hang_finding(tmp_path / "dumps"))
    assert f.verdict == "pass" and f.value == 0 and f.per_rank is None


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_rank_that_stops_launching_is_named_on_other_layouts(tmp_path, name):
    job = Job(**LAYOUTS[name])
    for i, faulty in enumerate(range(1, job.world, 3)):         # several ranks, stopping at several points
        at = step_len(job, faulty) + 1 + i
        job.run(stop_launch={faulty: at})
        a = analyse_folder(job.write(tmp_path / f"dumps{faulty}"))
        assert a["likely_faulty"] == [faulty], (faulty, a["suspects"])
        assert a["state"] == "hung" and faulty in a["stopped_at"]["not_enqueued"]
        assert a["suspects"][0]["confidence"] in ("high", "medium")
        job = Job(**LAYOUTS[name])


def _analysed(job):
    """The analysis of a simulated job's dumps, without files (checked like files)."""
    from pathlib import Path

    from preflight.diagnose.flight_recorder import analyse
    from preflight.diagnose.flight_recorder_dump import check_dump

    return analyse({r: check_dump(Path(f"_dump_{r}"), r, job.dump(r)) for r in range(job.world)})


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("name", ["dense tp2 pp3 dp2", "moe tp2 pp2 dp2 ep2"])
def test_every_rank_stopping_anywhere_is_named_and_nobody_else(name, window):
    """Every rank, every other op of the program: a rank that stops launching is named, alone; two that stop
    are named without a third (the second may be masked: it waits for the first)."""
    n = len(Job(**LAYOUTS[name]).program[0])
    named = cases = 0
    for f in range(Job(**LAYOUTS[name]).world):
        for at in range(1, n - 1, 2):
            job = Job(window=window, **LAYOUTS[name]).run(stop_launch={f: at})
            assert _analysed(job)["likely_faulty"] == [f], (f, at)
            other = (f + 3) % job.world
            a = _analysed(Job(window=window, **LAYOUTS[name]).run(stop_launch={f: at, other: at + 1}))
            assert a["likely_faulty"] and set(a["likely_faulty"]) <= {f, other}, (f, other, at, a["likely_faulty"])
            named, cases = named + len(a["likely_faulty"]), cases + 1
    assert named > 1.5 * cases                          # both named in most cases


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_gpu_that_stops_mid_collective_accuses_nobody(name):
    """Every CPU launches on; no launch lags, so no rank can be named from the dumps: none is."""
    job = Job(**LAYOUTS[name])
    for f in range(job.world):
        for at in range(1, len(job.program[0]) - 1, 3):
            a = _analysed(Job(**LAYOUTS[name]).run(stop_exec={f: at}))
            assert a["likely_faulty"] == [] and a["state"] == "hung, not attributed", (f, at)
            assert f in a["stopped_at"]["not_completed"] or f in {int(r) for r in a["waiting"]}


def test_two_faulty_ranks_and_an_empty_recorder(tmp_path):
    job = Job(tp=1, pp=2, dp=4, ep=4).run(stop_launch={5: 9, 6: 9})
    a = analyse_folder(job.write(tmp_path / "d", empty=(5,)))
    assert a["likely_faulty"] == [5, 6] and a["empty_dumps"] == [5]
    s = {x["rank"]: x for x in a["suspects"]}
    assert s[5]["confidence"] == "high" and any("holds no entries" in w for w in s[5]["reasons"])
    assert a["stopped_at"]["desc"] == "EXPERT_MODEL_PARALLEL_GROUP" and a["stopped_at"]["not_enqueued"] == [5, 6]


def test_a_missing_dump_is_named(tmp_path):
    job = Job(tp=2, pp=3, dp=2).run(stop_launch={7: 8})
    a = analyse_folder(job.write(tmp_path / "d", drop=(7,)))
    assert a["missing_dumps"] == [7] and a["likely_faulty"] == [7]
    assert "no dump file" in a["suspects"][0]["reasons"][0]


def test_a_hang_inside_a_collective_everyone_launched_blames_nobody(tmp_path):
    job = Job(tp=2, pp=1, dp=2).run(stop_exec={3: 4})            # a GPU stops mid-collective; every CPU launches on
    a = analyse_folder(job.write(tmp_path / "d"))
    assert a["state"] == "hung, not attributed" and a["likely_faulty"] == [] and a["suspects"] == []
    assert a["stopped_at"]["not_enqueued"] == [] and a["stopped_at"]["not_completed"]
    f = hang_finding(tmp_path / "d")
    assert f["verdict"] == "warn" and f["value"] == 0 and "below the ranks" in f["message"]


def test_a_desync_is_reported_and_its_rank_named(tmp_path):
    job = Job(tp=4, pp=1, dp=2)
    job.run(desync={2: (step_len(job) + 1, "nccl:_all_gather_base")})
    a = analyse_folder(job.write(tmp_path / "d"))
    mism = [m for g in a["groups"] for m in g["mismatches"]]
    assert len(mism) == 1 and mism[0]["field"] == "op" and mism[0]["odd"] == [2]
    assert a["likely_faulty"] == [2] and "desync" in a["suspects"][0]["reasons"][0]


def test_all_to_all_sizes_may_differ_but_other_sizes_may_not(tmp_path):
    job = Job(tp=1, pp=1, dp=4, ep=4).run()             # each rank's all-to-all input differs (128 + rank rows)
    a = analyse_folder(job.write(tmp_path / "d"))
    assert not [m for g in a["groups"] for m in g["mismatches"]]
    job = Job(tp=1, pp=1, dp=4, ep=4)
    i = next(i for i, op in enumerate(job.program[1]) if op[1] == "nccl:all_reduce")
    g, op, _, dt, p2p = job.program[1][i]
    job.program[1][i] = (g, op, [[8192]], dt, p2p)
    a = analyse_folder(job.run().write(tmp_path / "e"))
    mism = [m for g in a["groups"] for m in g["mismatches"]]
    assert [(m["field"], m["odd"]) for m in mism] == [("size", [1])]
    assert a["state"] == "desync" and a["suspects"][0]["confidence"] == "medium"


def test_ranks_text():
    assert ranks_text([8, 10, 11, 12, 13, 15]) == "8, 10-13, 15" and ranks_text([]) == "none"
    assert ranks_text([3, 4]) == "3, 4"


# --- malformed input: exit 2, the file named, nothing executed -----------------------------------------------

class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _good(tmp_path):
    return Job(tp=2, pp=1, dp=1).run().write(tmp_path / "dumps")


def test_a_pickle_that_asks_for_a_class_is_refused_and_not_run(tmp_path):
    d = _good(tmp_path)
    marker = tmp_path / "executed"
    data = Job(tp=2).run().dump(1)
    data["entries"][0]["frames"] = _Evil(marker)
    (d / "_dump_1").write_bytes(pickle.dumps(data, protocol=2))
    r = hang(d)
    assert r.returncode == 2 and "_dump_1" in r.stderr and "asks for the global" in r.stderr
    assert ("posix.system" in r.stderr or "os.system" in r.stderr) and not marker.exists()
    (d / "_dump_1").write_bytes(pickle.dumps(data["pg_config"] | {"x": re.compile("a")}, protocol=4))
    r = hang(d)
    assert r.returncode == 2 and "re._compile" in r.stderr and not marker.exists()


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[: len(b) // 2], "truncated"),
    (lambda b: b"not a pickle at all\n", "not a readable pickle"),
    (lambda b: b"", "truncated"),
])
def test_truncated_or_not_a_pickle(tmp_path, damage, words):
    d = _good(tmp_path)
    (d / "_dump_0").write_bytes(damage((d / "_dump_0").read_bytes()))
    r = hang(d)
    assert r.returncode == 2 and "_dump_0" in r.stderr and words in r.stderr


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.pop("pg_status"), "no 'pg_status' field"),
    (lambda d: d.update(entries={}), "entries: expected a list"),
    (lambda d: d["entries"][0].pop("collective_seq_id"), "entries[0]: no 'collective_seq_id' field"),
    (lambda d: d["entries"][0].update(pg_id="1"), "entries[0].pg_id: expected a local group id"),
    (lambda d: d["entries"][0].update(input_sizes=[["a"]]), "entries[0].input_sizes: expected shapes"),
    (lambda d: d["entries"][0].update(process_group="1"), "entries[0].process_group: expected [name, desc]"),
    (lambda d: next(iter(d["pg_config"].values())).update(ranks="[0, x]"), ".ranks: expected a list of ranks"),
    (lambda d: next(iter(d["pg_status"].values())).update(last_completed_collective=None),
     "last_completed_collective: expected a sequence number"),
    (lambda d: d["entries"][0].update(process_group=("999", "X")), "group '999' is not in this dump's pg_config"),
    (lambda d: d.__setitem__("pg_config", [1]), "pg_config: expected a dict"),
])
def test_wrong_structure_names_the_file_and_field(tmp_path, edit, words):
    d = _good(tmp_path)
    data = Job(tp=2).run().dump(1)
    edit(data)
    (d / "_dump_1").write_bytes(pickle.dumps(data, protocol=2))
    r = hang(d)
    assert r.returncode == 2 and "_dump_1" in r.stderr and words in r.stderr, r.stderr
    with pytest.raises(DumpError):
        analyse_folder(d)


def test_the_folder_itself(tmp_path):
    (tmp_path / "empty").mkdir()
    r = hang(tmp_path / "empty")
    assert r.returncode == 2 and "no Flight Recorder dumps" in r.stderr and "empty" in r.stderr
    (tmp_path / "afile").write_text("x")
    r = hang(tmp_path / "afile")
    assert r.returncode == 2 and "afile" in r.stderr and "not a folder" in r.stderr
    r = hang(tmp_path / "nowhere")
    assert r.returncode == 2 and "no such folder" in r.stderr
    d = _good(tmp_path)
    (d / "rank_0").write_bytes((d / "_dump_0").read_bytes())
    r = hang(d)
    assert r.returncode == 2 and "more than one set of dumps" in r.stderr
    (d / "rank_0").unlink()
    (d / "_dump_5").write_bytes((d / "_dump_0").read_bytes())       # a file whose name is not its rank
    r = hang(d)
    assert r.returncode == 2 and "_dump_5" in r.stderr and "in none of its pg_config groups" in r.stderr
    (d / "_dump_5").unlink()
    r = hang(d, "--svg", tmp_path / "no" / "x.svg")
    assert r.returncode == 2 and "its folder does not exist" in r.stderr


# --- the README's command, as written ------------------------------------------------------------------------

@needs_shared
def test_readme_hang_block_as_written():
    import shlex

    text = (REPO / "README.md").read_text()
    section = text.split("## Which rank hung the job: `hang`", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in block.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("python -m preflight hang ") for ln in lines)
    outs = []
    for ln in lines:
        r = subprocess.run([PY if a == "python" else a for a in shlex.split(ln)], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
        assert r.returncode == 0, (ln, r.stderr)
        outs.append(r.stdout)
    assert "likely faulty ranks: 9, 14" in outs[0]
    assert json.loads(outs[1])["likely_faulty"] == [9, 14]
