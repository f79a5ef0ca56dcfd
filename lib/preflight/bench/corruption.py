"""Corruption, live: what the checkpoint loader (``preflight.toolkit.ckpt``) does with a damaged checkpoint
and with a hostile one.

1. Two checkpoints are saved, then the newest is damaged: one flipped byte in the middle of its
   state file, as a failing disk or an interrupted copy leaves it. The manifest's sha256 catches it;
   ``ckpt.load_latest`` warns why and falls back to the previous checkpoint.
2. A checkpoint whose pickle runs a shell command when loaded (``__reduce__``), with the manifest
   rewritten by the attacker so that every checksum is right. Checksums cannot catch it;
   ``torch.load(weights_only=True)`` refuses it. The command would create a marker file, so the
   result says whether code ran (it must not).

Chapter 5 shows it when it measures. ``demo`` writes only under ``folder`` and removes it at the end.
"""
from __future__ import annotations

import os
import shlex
import shutil
import warnings
from pathlib import Path

from preflight.toolkit import ckpt


class HostilePickle:
    """Unpickling this runs ``touch <marker>``: what a malicious checkpoint would do (also used by
    tests/test_ckpt.py)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def demo(folder: str | os.PathLike) -> dict:
    """Run both cases in ``folder`` (created, then removed). Keys: ``loaded_step`` (the step
    ``load_latest`` fell back to: 10), ``loaded_from`` (its folder name), ``warnings`` (what the
    loader said, paths relative to ``folder``), ``refused`` (the loader's first sentence on the hostile
    checkpoint, None if it loaded it) and ``ran_code`` (the payload's marker exists: must be False)."""
    import torch

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    here = str(folder) + os.sep
    try:
        for step in (10, 20):
            ckpt.save({"step": step, "w": torch.full((1000,), float(step))}, folder, step)
        blob = folder / ckpt.step_name(20) / ckpt.STATE_FILE
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step, _, loaded = ckpt.load_latest(folder)

        marker = folder / "payload-ran"
        evil = folder / ckpt.step_name(30)
        evil.mkdir()
        torch.save({"step": 30, "boom": HostilePickle(marker)}, evil / ckpt.STATE_FILE)
        ckpt._manifest(evil, 30, {ckpt.STATE_FILE: ckpt.sha256_file(evil / ckpt.STATE_FILE)})  # fixed by the attacker
        try:
            ckpt.load(evil)
            refused = None
        except ValueError as err:
            refused = (str(err).split(". ")[0] + ".").replace(here, "")
        return {"loaded_step": step, "loaded_from": loaded.name,
                "warnings": [str(w.message).replace(here, "") for w in caught],
                "refused": refused, "ran_code": marker.exists()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
