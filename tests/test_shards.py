"""preflight.toolkit.shards: small files -> tar shards, resumable conversion, checked reading, CLI."""
import hashlib
import json
import re
import shutil
import tarfile
import zlib
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from conftest import run_cli
from preflight import cli
from preflight.harness import samples
from preflight.toolkit import shards

N = 240                   # samples in the test tree (a few kB each)
SHARD = 64_000            # 64 kB shards: about 25 shards


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _source_digests(src: Path) -> dict:
    """{key: sha256 of the file} for the small-file tree."""
    return {samples.sample_name(i).removesuffix(".img.zz"): _sha((src / samples.sample_name(i)).read_bytes())
            for i in range(N)}


def _shard_digests(dst: Path) -> dict:
    return {p.name: _sha(p.read_bytes()) for p in sorted(dst.glob("shard-*.tar"))}


def _leftovers(dst: Path) -> list:
    return sorted(p.name for p in dst.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("small") / "src"
    samples.write_small_files(root, N, sync=False)
    return root


@pytest.fixture(scope="module")
def clean(src, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("clean") / "shards"
    shards.convert(src, dst, SHARD)
    return dst


@pytest.fixture
def copy(clean, tmp_path) -> Path:
    """A private copy of the clean shard set, to damage."""
    return Path(shutil.copytree(clean, tmp_path / "shards"))


@pytest.mark.parametrize("text, n", [("256MB", 256_000_000), ("500kB", 500_000), ("1GB", 10**9),
                                     ("1GiB", 2**30), ("64MiB", 64 * 2**20), ("1000000", 10**6),
                                     ("64 mib", 64 * 2**20), ("1.5gb", 1_500_000_000), ("1B", 1)])
def test_parse_size(text, n):
    assert shards.parse_size(text) == n


@pytest.mark.parametrize("text", ["", "abc", "12XB", "-5MB", "0", "0.1B", "1e9", "MB", "1 M B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="accepted forms"):
        shards.parse_size(text)


def test_round_trip_every_sample_exactly_once(src, clean):
    m = shards.load_manifest(clean)
    assert m["complete"] and m["format"] == shards.FORMAT and m["source"] == str(src.resolve())
    assert m["samples"] == N == sum(s["samples"] for s in m["shards"]) and len(m["shards"]) >= 10
    assert [s["name"] for s in m["shards"]] == [f"shard-{i:06d}.tar" for i in range(len(m["shards"]))]
    assert shards.shard_urls(clean) == [str(clean / s["name"]) for s in m["shards"]]
    for s in m["shards"]:
        assert s["bytes"] == (clean / s["name"]).stat().st_size
        assert s["sha256"] == _sha((clean / s["name"]).read_bytes())
    want = _source_digests(src)

    got = [(s["__key__"], _sha(s["img.zz"])) for s in shards.shard_pipeline(clean)]
    assert got == sorted(want.items())                       # sorted key order, bytes unchanged

    mixed = [(s["__key__"], _sha(s["img.zz"])) for s in shards.shard_pipeline(clean, shuffle_buffer=50)]
    assert sorted(mixed) == sorted(want.items()) and mixed != got
    again = [s["__key__"] for s in shards.shard_pipeline(clean, shuffle_buffer=50)]
    assert again == [k for k, _ in mixed]                   # seeded: reproducible
    by_shard = [s["__key__"] for s in shards.shard_pipeline(clean, shuffle_shards=True, seed=3)]
    assert sorted(by_shard) == sorted(want) and by_shard != [k for k, _ in got]


def test_samples_carry_shard_and_index(clean):
    m = shards.load_manifest(clean)
    first = m["shards"][1]
    s = list(shards.iter_shard(clean / first["name"], first["samples"]))
    assert [x["__index__"] for x in s] == list(range(first["samples"]))
    assert s[0]["__key__"] == first["first_key"] and s[-1]["__key__"] == first["last_key"]
    assert s[0]["__url__"] == str(clean / first["name"])


def test_shard_size_boundaries(src, clean, tmp_path):
    m = shards.load_manifest(clean)
    for s in m["shards"]:
        assert s["bytes"] <= SHARD or s["samples"] == 1
    exact = m["shards"][0]["bytes"]       # a limit equal to a shard's size still admits that shard
    r = shards.convert(src, tmp_path / "exact", exact)
    assert shards.load_manifest(tmp_path / "exact")["shards"][0]["samples"] == m["shards"][0]["samples"]
    r = shards.convert(src, tmp_path / "less", exact - 1)
    first = shards.load_manifest(tmp_path / "less")["shards"][0]
    assert first["samples"] < m["shards"][0]["samples"] and first["bytes"] <= exact - 1
    r = shards.convert(src, tmp_path / "big", 10**9)
    assert (r["shards"], r["samples"]) == (1, N)
    r = shards.convert(src, tmp_path / "tiny", 100)            # smaller than one sample: one per shard
    assert (r["shards"], r["samples"]) == (N, N)
    assert sorted(s["__key__"] for s in shards.shard_pipeline(tmp_path / "tiny")) == sorted(_source_digests(src))


def test_resume_after_interruption(src, clean, tmp_path):
    dst = tmp_path / "shards"

    def stop_after_two(done, total, shards_done):
        if shards_done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        shards.convert(src, dst, SHARD, progress=stop_after_two)
    assert len(list(dst.glob("shard-*.tar"))) == 2 and _leftovers(dst) == []
    with pytest.raises(shards.ShardError, match="incomplete"):
        shards.load_manifest(dst)
    calls = []
    r = shards.convert(src, dst, SHARD, progress=lambda *a: calls.append(a))
    assert r["resumed_shards"] == 2 and r["samples"] == N and r["shards"] == len(calls) + 2
    assert calls[-1][:2] == (N, N)
    assert _shard_digests(dst) == _shard_digests(clean) and _leftovers(dst) == []
    assert shards.load_manifest(dst)["shards"] == shards.load_manifest(clean)["shards"]


def test_resume_redoes_from_first_bad_shard(src, clean, tmp_path):
    dst = Path(shutil.copytree(clean, tmp_path / "shards"))
    m = json.loads((dst / "manifest.json").read_text())
    m["complete"] = False                                    # as if killed after shard 5
    m["shards"] = m["shards"][:6]
    (dst / "manifest.json").write_text(json.dumps(m))
    for p in sorted(dst.glob("shard-*.tar"))[6:]:
        p.unlink()
    (dst / "shard-000006.tar.tmp").write_bytes(b"half a shard")
    bad = dst / "shard-000003.tar"                           # ... and shard 3 damaged since
    bad.write_bytes(bad.read_bytes()[:-20000])
    r = shards.convert(src, dst, SHARD)
    assert r["resumed_shards"] == 3
    assert _shard_digests(dst) == _shard_digests(clean) and _leftovers(dst) == []


def test_refuses_to_overwrite_without_force(src, copy, tmp_path):
    before = _shard_digests(copy)
    with pytest.raises(shards.ShardError, match="--force"):
        shards.convert(src, copy, SHARD)
    with pytest.raises(shards.ShardError, match="--force"):
        shards.convert(src, copy, 2 * SHARD)                  # other shard size: not a resume either
    assert _shard_digests(copy) == before
    r = shards.convert(src, copy, 2 * SHARD, force=True)
    assert r["resumed_shards"] == 0 and r["samples"] == N and r["shards"] < len(before)
    assert len(list(copy.glob("shard-*.tar"))) == r["shards"]
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "shard-000000.tar").write_bytes(b"someone's data")
    with pytest.raises(shards.ShardError, match="--force"):
        shards.convert(src, stray, SHARD)
    assert (stray / "shard-000000.tar").read_bytes() == b"someone's data"


def test_bad_source(tmp_path, src):
    with pytest.raises(shards.ShardError, match="no such folder"):
        shards.convert(tmp_path / "missing", tmp_path / "out", SHARD)
    (tmp_path / "file").write_text("x")
    with pytest.raises(shards.ShardError, match="not a folder"):
        shards.convert(tmp_path / "file", tmp_path / "out", SHARD)
    (tmp_path / "empty").mkdir()
    with pytest.raises(shards.ShardError, match="no sample files"):
        shards.convert(tmp_path / "empty", tmp_path / "out", SHARD)
    with pytest.raises(shards.ShardError, match="inside the source"):
        shards.convert(src, src / "shards", SHARD)
    with pytest.raises(ValueError, match="shard_bytes"):
        shards.convert(src, tmp_path / "out", 0)
    assert not (tmp_path / "out").exists()
    broken = Path(shutil.copytree(src, tmp_path / "broken"))
    (broken / "cls_05" / "99999999.img.zz").symlink_to(tmp_path / "nowhere")   # unreadable file
    with pytest.raises(shards.ShardError, match="99999999.img.zz: cannot read"):
        shards.convert(broken, tmp_path / "out", SHARD)
    assert _leftovers(tmp_path / "out") == []


def _member_offsets(path: Path) -> list:
    """(header offset, data offset, size) of each member."""
    with tarfile.open(path) as tar:
        return [(m.offset, m.offset_data, m.size) for m in tar.getmembers()]


def test_truncated_shard_mid_member(copy):
    m = shards.load_manifest(copy)
    victim = copy / m["shards"][2]["name"]
    victim.write_bytes(victim.read_bytes()[:victim.stat().st_size // 2])
    seen = []
    with pytest.raises(shards.ShardError) as err:
        for s in shards.shard_pipeline(copy):
            seen.append(s["__key__"])
    e = err.value
    assert e.shard == "shard-000002.tar" and 0 < e.index < m["shards"][2]["samples"]
    assert re.match(rf"shard-000002\.tar: sample {e.index} \(.*key cls_\d\d/\d{{8}}\): truncated", str(e))
    assert len(seen) == m["shards"][0]["samples"] + m["shards"][1]["samples"] + e.index


def test_truncated_at_sample_boundary_is_counted(copy):
    m = shards.load_manifest(copy)
    victim = copy / m["shards"][4]["name"]
    cut = _member_offsets(victim)[5][0]                     # header of member 5: a valid, short tar
    victim.write_bytes(victim.read_bytes()[:cut])
    assert len(list(shards.iter_shard(victim, expected=None))) == 5
    with pytest.raises(shards.ShardError, match=r"shard-000004\.tar: sample 5 .*only 5 of"):
        list(shards.shard_pipeline(copy))


def test_skip_counts_and_warns(copy):
    m = shards.load_manifest(copy)
    for i, frac in [(1, 0.5), (6, 0.3)]:
        victim = copy / m["shards"][i]["name"]
        data = victim.read_bytes()
        victim.write_bytes(data[:int(len(data) * frac)])
    stats = shards.SkipStats()
    with pytest.warns(UserWarning) as caught:
        keys = [s["__key__"] for s in shards.shard_pipeline(copy, on_error="skip", stats=stats)]
    found = [re.match(r"skipped (\d+) sample\(s\): (shard-\d+\.tar): sample \d+ ", str(w.message)).groups()
             for w in caught]
    assert [shard for _, shard in found] == ["shard-000001.tar", "shard-000006.tar"]
    assert sum(int(n) for n, _ in found) == stats.skipped_samples
    lost = N - len(keys)
    assert lost > 0 and stats.skipped_samples == lost and len(set(keys)) == len(keys)
    assert [b[0] for b in stats.bad_shards] == ["shard-000001.tar", "shard-000006.tar"]
    others = [s for i, s in enumerate(m["shards"]) if i not in (1, 6)]
    good = {x["__key__"] for s in others for x in shards.iter_shard(copy / s["name"], s["samples"])}
    assert len(good) == sum(s["samples"] for s in others) and good <= set(keys)   # all delivered


def test_flipped_payload_byte_fails_in_transform(copy):
    m = shards.load_manifest(copy)
    victim = copy / m["shards"][3]["name"]
    _, data_at, size = _member_offsets(victim)[7]
    data = bytearray(victim.read_bytes())
    data[data_at + size // 2] ^= 0xFF                          # the tar stays valid
    victim.write_bytes(bytes(data))
    decode = lambda s: samples.decode(s["img.zz"])
    with pytest.raises(shards.ShardError, match=r"shard-000003\.tar: sample 7 \(key .*\): transform failed") as e:
        list(shards.shard_pipeline(copy, transform=decode))
    with tarfile.open(victim) as tar:
        assert e.value.key == tar.getmembers()[7].name.removesuffix(".img.zz")
    assert isinstance(e.value.__cause__, zlib.error) and e.value.index == 7
    stats = shards.SkipStats()
    with pytest.warns(UserWarning, match="skipped 1 sample"):
        out = list(shards.shard_pipeline(copy, transform=decode, on_error="skip", stats=stats))
    assert len(out) == N - 1 and stats.skipped_samples == 1


def test_partial_sample_never_delivered(tmp_path):
    """Two fields per sample; a tar cut between a sample's members must not yield a half sample."""
    src = tmp_path / "src"
    samples.write_small_files(src, 12, sync=False)
    for p in src.rglob("*.img.zz"):
        p.with_name(p.name.replace(".img.zz", ".cls")).write_text(p.parent.name)
    shards.convert(src, tmp_path / "dst", 10**6)
    victim = tmp_path / "dst" / "shard-000000.tar"
    offsets = _member_offsets(victim)
    victim.write_bytes(victim.read_bytes()[:offsets[-1][0]])  # drop the last member: img.zz of sample 11
    with pytest.raises(shards.ShardError, match=r"sample 11 \(key .*\): fields \['cls'\], expected"):
        list(shards.iter_shard(victim, expected=None))
    stats = shards.SkipStats()
    with pytest.warns(UserWarning):
        got = list(shards.shard_pipeline(tmp_path / "dst", on_error="skip", stats=stats))
    assert len(got) == 11 and all({"cls", "img.zz"} <= set(s) for s in got) and stats.skipped_samples == 1
    (src / "cls_00" / "00000000.cls").unlink()                # non-uniform source: refused
    with pytest.raises(shards.ShardError, match="same fields"):
        shards.convert(src, tmp_path / "dst2", 10**6)


def test_dataloader_workers_see_every_sample_once(clean, src):
    key = lambda s: s["__key__"]
    loader = DataLoader(shards.shard_pipeline(clean, transform=key, shuffle_buffer=20), batch_size=None,
                        num_workers=2)
    keys = list(loader)
    assert len(keys) == N and set(keys) == set(_source_digests(src))



@pytest.mark.parametrize("via", ["env", "torch.distributed"])
def test_ranks_read_disjoint_shard_subsets(clean, monkeypatch, via):
    """webdataset.split_by_node takes rank/world from RANK and WORLD_SIZE (torchrun), else from an
    initialised torch.distributed; each rank must read its own shards and together all of them."""
    for var in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(var, raising=False)
    urls = shards.shard_urls(clean)
    world, seen = 2, []
    for rank in range(world):
        if via == "env":
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
        else:
            monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
            monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
            monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None, r=rank: r)
            monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: world)
        got = [s["__url__"] for s in shards.shard_pipeline(clean, shuffle_shards=True, seed=1)]
        seen.append(set(got))
        assert seen[-1] and len(got) == sum(s["samples"] for s in shards.load_manifest(clean)["shards"]
                                            if str(clean / s["name"]) in seen[-1])
        whole = {s["__url__"] for s in shards.shard_pipeline(clean, split_by_node=False)}
        assert whole == set(urls)                              # opt-out: every rank reads everything
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(urls)
    assert abs(len(seen[0]) - len(seen[1])) <= 1


def test_batches_and_small_file_dataset(clean, src):
    aug = lambda s: samples.decode_augment(s["img.zz"])
    batches = list(shards.shard_pipeline(clean, transform=aug, batch_size=64))
    assert [b.shape[0] for b in batches] == [64, 64, 64, 48]
    assert batches[0].shape[1:] == (3, samples.CROP, samples.CROP) and batches[0].dtype == torch.float32
    ds = shards.small_file_dataset(src)
    assert len(ds) == N and ds[0]["__key__"] == "cls_00/00000000"
    assert _sha(ds[5]["img.zz"]) == _source_digests(src)[ds[5]["__key__"]]
    loader = DataLoader(shards.small_file_dataset(src, aug), batch_size=32,
                        sampler=RandomSampler(range(N), generator=torch.Generator().manual_seed(0)))
    assert sum(b.shape[0] for b in loader) == N


def test_argument_validation(clean, tmp_path):
    with pytest.raises(ValueError, match="'raise' and 'skip'"):
        shards.shard_pipeline(clean, on_error="ignore")
    with pytest.raises(ValueError, match="'raise' and 'skip'"):
        next(shards.iter_shard(shards.shard_urls(clean)[0], on_error="warn"))
    with pytest.raises(ValueError, match="shuffle_buffer"):
        shards.shard_pipeline(clean, shuffle_buffer=-1)
    with pytest.raises(ValueError, match="batch_size"):
        shards.shard_pipeline(clean, batch_size=0)
    with pytest.raises(shards.ShardError, match="no shard manifest"):
        shards.shard_urls(tmp_path)
    with pytest.raises(shards.ShardError, match="sample 0: cannot open"):
        next(shards.iter_shard(tmp_path / "shard-000000.tar"))


# ---------------------------------------------------------------- CLI

def test_cli_converts_and_refuses_overwrite(src, tmp_path):
    dst = tmp_path / "shards"
    r = run_cli("shards", src, dst, "--shard-size", "64kB")
    assert r.returncode == 0, r.stderr
    n = len(list(dst.glob("shard-*.tar")))
    assert r.stdout.strip().splitlines()[-1] == (f"{N} samples in {n} shards "
                                                 f"({sum(p.stat().st_size for p in dst.glob('*.tar')) / 1e6:.1f} MB)"
                                                 f" -> {dst} (verified)")
    assert re.search(rf"  {n} shards, {N}/{N} samples, [\d.]+ MB written", r.stderr)
    before = _shard_digests(dst)
    r = run_cli("shards", src, dst, "--shard-size", "64kB")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "--force" in r.stderr
    assert _shard_digests(dst) == before
    r = run_cli("shards", src, dst, "--shard-size", "128kB", "--force", "--quiet")
    assert r.returncode == 0 and r.stderr == "" and r.stdout.count("\n") == 1
    assert len(list(dst.glob("shard-*.tar"))) < n


def test_cli_bad_input_writes_nothing(src, tmp_path, capsys):
    dst = tmp_path / "out"
    r = run_cli("shards", src, dst, "--shard-size", "12XB")
    assert r.returncode == 2 and r.stderr.startswith("error: --shard-size = '12XB': ") and "accepted" in r.stderr
    r = run_cli("shards", tmp_path / "missing", dst)
    assert r.returncode == 2 and r.stderr.startswith("error: SRC_DIR = ") and "no such folder" in r.stderr
    for size in ["0", "200GB", "-1MB", "lots"]:        # the same checks, in-process (fast)
        with pytest.raises(SystemExit) as exit_:
            cli.main(["shards", str(src), str(dst), f"--shard-size={size}"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --shard-size = '{size}': ") and "accepted" in err, err
    with pytest.raises(SystemExit):
        cli.main(["shards", str(tmp_path / "file.txt"), str(dst)])
    assert not dst.exists()
    broken = Path(shutil.copytree(src, tmp_path / "broken"))
    (broken / "cls_01" / "99999999.img.zz").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["shards", str(broken), str(dst), "--quiet"])
    assert exit_.value.code == 2 and "99999999.img.zz: cannot read" in capsys.readouterr().err
    assert not list(dst.glob("shard-*.tar")) and _leftovers(dst) == []
