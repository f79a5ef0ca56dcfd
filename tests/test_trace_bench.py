"""tools/bench_traces.py --decoders, as the README quotes it (a small trace: the record's shape, not timings)."""
import json
import subprocess
import sys

from conftest import REPO


def test_bench_traces_decoders_writes_its_record(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "tools/bench_traces.py"), "--decoders", "--events", "3000",
                        "--repeats", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((tmp_path / "trace_decoder_bench.json").read_text())
    res = rec["decoders"]["results"]
    assert rec["method"] == "trace_decoder_bench" and {"json.loads", "reader (json + filtering hook)"} <= set(res)
    assert res["json.loads"]["time_vs_json_loads"] == 1.0
    for name in ("orjson.loads", "msgspec.json.decode", "reader (msgspec, raw slices)"):
        assert (name in res) != (name in rec["decoders"]["not_installed"])
