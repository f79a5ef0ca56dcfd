"""Profile validation: good input loads, every kind of bad input gives one clear message, exit 2,
and nothing written."""
import copy

import pytest
import yaml

from conftest import EXAMPLE, run_cli
from preflight.core.profile import ProfileError, load_profile, parse_profile

BASE = yaml.safe_load(EXAMPLE.read_text())


def test_example_loads():
    p = load_profile(EXAMPLE)
    assert p.project == "llm-7b-pretrain"
    assert p.gpus == 1024 and p.dp == 1024
    assert p.model.params == 7e9 and p.cluster.inter_node_Gbps == 200


def test_defaults_fill_in():
    p = parse_profile({"project": "x", "model": {"params": 1e9, "layers": 24, "hidden": 2048, "seq_len": 2048}})
    assert p.training.grad_dtype == "fp32" and p.cluster.gpus_per_node == 8 and p.measure is True


def _with(path: str, value):
    d = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = d
    for k in parents:
        node = node[k]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("path,value,expect", [
    ("project", "bad name!", "project = 'bad name!'"),
    ("project", "", "project"),
    ("model.params", -5, "model.params = -5"),
    ("model.params", "seven billion", "model.params = 'seven billion'"),
    ("model.layers", 0, ">= 1"),
    ("model.hidden", KeyError, "model.hidden = (missing)"),
    ("model.colour", "red", "model.colour = 'red': unknown field"),
    ("cluster.gpu", "V100", "unknown GPU 'V100'; accepted: auto, A100-SXM"),
    ("cluster.nodes", 0, "cluster.nodes = 0"),
    ("cluster.nodes", 2.5, "cluster.nodes = 2.5"),
    ("cluster.node_failure_per_day", 1.0, "< 1"),
    ("cluster.inter_node_Gbps", 0, "cluster.inter_node_Gbps = 0"),
    ("training.grad_dtype", "fp8", "training.grad_dtype = 'fp8'"),
    ("training.tp", 3, "must divide the GPU count"),
    ("training.pipeline_schedule", "zigzag", "training.pipeline_schedule"),
    ("training.interleave", 2, "needs pipeline_schedule: interleaved"),
    ("training.step_compute_s", 0, "training.step_compute_s = 0"),
    ("training.restart_s", -1, "training.restart_s = -1"),
    ("training.zero_stage", 4, "training.zero_stage = 4"),
    ("training.activation_recompute", "some", "training.activation_recompute = 'some'"),
    ("training.micro_batch_size", 0, "training.micro_batch_size = 0"),
    ("training.sequence_parallel", "maybe", "training.sequence_parallel = 'maybe'"),
    ("model.heads", 3, "model.heads = 3 must divide model.hidden = 4096"),
    ("model.vocab", 0, "model.vocab = 0"),
    ("cluster.gpu_memory_GB", 0, "cluster.gpu_memory_GB = 0"),
    ("training.checkpoint_interval_s", 0, "training.checkpoint_interval_s = 0"),
    ("training.checkpoint_interval_s", "hourly", "training.checkpoint_interval_s = 'hourly'"),
    ("data.storage", "floppy", "data.storage = 'floppy'"),
    ("data.scratch_dir", "scratch/me", "data.scratch_dir = 'scratch/me': 'scratch/me' must be an absolute path"),
    ("measure", "sometimes", "measure = 'sometimes'"),
    ("extra_top", 1, "extra_top = 1: unknown field"),
])
def test_bad_fields_are_named(path, value, expect):
    with pytest.raises(ProfileError) as e:
        parse_profile(_with(path, value))
    assert expect in str(e.value)


def test_not_a_mapping():
    with pytest.raises(ProfileError, match="expected a YAML mapping"):
        parse_profile([1, 2, 3])


def test_unreadable_yaml(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("project: [unclosed\n  model: {")
    with pytest.raises(ProfileError, match="not readable YAML"):
        load_profile(p)


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "nope.yaml")


@pytest.mark.parametrize("content,expect", [
    (None, "not found"),
    ("project: x\nmodel: {params: 1e9, layers: 2, hidden: 64, seq_len: 8}\ncluster: {nodes: -1}\n",
     "cluster.nodes = -1"),
    ("::: not yaml :::\n\t- [", "not readable YAML"),
])
def test_cli_bad_profile_exit_2_nothing_written(tmp_path, content, expect):
    prof = tmp_path / "p.yaml"
    if content is not None:
        prof.write_text(content)
    out = tmp_path / "out"
    r = run_cli("audit", prof, "--out", out, "--plan-only")
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("args,expect", [
    (["--chapters", "9"], "chapter(s) [9] not available"),
    (["--chapters", "one"], "expected comma-separated chapter numbers"),
    (["--timeout", "5"], "accepted range is 10 to 86400"),
    (["--timeout", "abc"], "expected whole seconds"),
    (["--fail-on", "never"], "invalid choice"),
    (["--results", "/nonexistent/dir"], "--results"),
])
def test_cli_bad_arguments_exit_2(tmp_path, args, expect):
    out = tmp_path / "out"
    r = run_cli("audit", EXAMPLE, "--out", out, *args)
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_cli_validate_prints_filled_profile():
    r = run_cli("validate", EXAMPLE)
    assert r.returncode == 0
    assert "1024 GPUs, data-parallel size 1024" in r.stdout


def test_profile_that_is_a_folder(tmp_path):
    with pytest.raises(ProfileError, match="is a folder"):
        load_profile(tmp_path)


def test_no_serial_part_gives_an_unbounded_ceiling():
    from preflight.chapters import baseline as B
    from preflight.core.findings import FindingSink

    p = parse_profile(_with("training.step_serial_s", 0))
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p))
    f = {x.id: x for x in sink.findings}["baseline/amdahl_max_speedup"]
    assert f.value is None and f.verdict == "info" and "without bound" in f.message          # weak: info
    p = parse_profile(_with("training.step_serial_s", 0) | {})
    strong = p.model_copy(update={"training": p.training.model_copy(update={"scaling": "strong"})})
    sink = FindingSink()
    B.add_plan_findings(sink, strong, B.plan_curve(strong))
    assert {x.id: x for x in sink.findings}["baseline/amdahl_max_speedup"].verdict == "pass"    # strong: decides


@pytest.mark.parametrize("changes, words", [
    ({"model": {"kv_heads": 5}}, "model.kv_heads = 5 must divide model.heads = 32"),
    ({"model": {"kv_heads": 4}, "training": {"tp": 8}}, "training.tp = 8 must divide model.kv_heads = 4"),
    ({"training": {"framework": "fsdp2"}}, "training.zero_stage = 0 is not available with training.framework = fsdp2"),
    ({"training": {"framework": "megatron", "zero_stage": 2}}, "accepted 0, 1"),
    ({"model": {"attention": "sdpa"}}, "model.attention = 'sdpa'"),
    ({"model": {"dropout": 1.0}}, "model.dropout = 1.0"),
    ({"training": {"shard_group": "rack"}}, "training.shard_group = 'rack'")])
def test_memory_plan_fields_are_checked_naming_the_field(changes, words):
    d = yaml.safe_load(EXAMPLE.read_text())
    for section, fields in changes.items():
        d[section].update(fields)
    with pytest.raises(ProfileError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_profile(d)


def test_memory_plan_field_defaults():
    m, t = parse_profile(yaml.safe_load(EXAMPLE.read_text())).model, parse_profile({"project": "x", "model": {
        "params": 7e9, "layers": 32, "hidden": 4096, "seq_len": 4096}}).training
    assert (m.attention, m.mlp, m.ffn_hidden, m.n_kv_heads, m.dropout) == ("flash", "gelu", None, 32, 0.1)
    assert (t.framework, t.shard_group) == ("deepspeed", "dp")


def test_every_problem_is_said_at_once_fields_and_rules_across_them():
    """A bad field stops pydantic before the rules across fields; the message still names both."""
    d = yaml.safe_load(EXAMPLE.read_text())
    d["data"]["storage"], d["training"]["tp"] = "weka", 3
    with pytest.raises(ProfileError) as e:
        parse_profile(d, "p.yaml")
    msg = str(e.value)
    assert "data.storage = 'weka'" in msg and "training.tp * training.pp * training.cp = 3 must divide" in msg
    # in a notebook IPython shows this instead of a traceback through the library
    shown = e.value._render_traceback_()
    assert shown[0] == "invalid profile p.yaml:" and "python -m preflight validate PROFILE" in shown[-1]
