"""Chapter 2's sliders: metadata listing time, and loader supply against device consumption."""
from __future__ import annotations

import ipywidgets as W

from preflight.core.numfmt import seconds
from preflight.reporting import charts
from preflight.widgets.core import _log_slider, explorer, readout


def listing_explorer(files: int, per_file_ms: float, mean_file_kB: float) -> W.VBox:
    """Sliders: file count x per-file metadata latency -> start-up listing time, vs shards."""
    from preflight.models import data as M

    controls = {"files": _log_slider(files, 1e3, 1e10, "files"),
                "per_file_ms": _log_slider(per_file_ms, 1e-3, 100, "stat per file (ms)"),
                "shard_MB": W.IntSlider(value=256, min=16, max=1024, step=16, description="shard size (MB)",
                                        style={"description_width": "170px"}, layout=W.Layout(width="520px"))}

    def compute(files, per_file_ms, shard_MB):
        n = int(files)
        t = M.listing_time_s(n, "lustre", per_file_ms / 1e3)
        shards = M.shard_count(n, mean_file_kB, shard_MB)
        ts = M.listing_time_s(shards, "lustre", per_file_ms / 1e3)
        text = readout({"listing_s": ("listing, small files", seconds(t)),
                        "shards": (f"shards of {shard_MB} MB", f"{shards:,}"),
                        "listing_shards_s": ("listing, shards", seconds(ts))})
        import pandas as pd

        xs = [10 ** (k / 4) for k in range(12, 41)]
        # gpfs is assumed equal to lustre and object stores list in pages: drawn lines would hide each other
        df = pd.DataFrame([{"files": x, "listing (s)": M.listing_time_s(int(x), "lustre", lat.stat_s if s != "slider"
                                                                          else per_file_ms / 1e3), "storage": s}
                           for x in xs for s, lat in [*M.METADATA_LATENCY.items(), ("slider", None)]
                           if s not in ("object", "gpfs")])
        df["storage"] = df["storage"].replace({"lustre": "lustre / gpfs", "slider": "your latency (slider)"})
        return text, charts.curves(df, "files", "listing (s)", "storage", mark_x=n,
                                   title="Start-up listing time (one client, serial)")

    return explorer(controls, compute, "Small files: listing time explorer")


def supply_explorer(supply: float, consume: float, measured_idle: float | None = None) -> W.VBox:
    """Sliders: supply vs consumption rate (samples/s) -> headroom, device idle share, verdict."""
    from preflight.core.findings import judge
    from preflight.models import data as M

    supply0, consume0 = supply, consume
    hi = max(supply, consume) * 10
    controls = {"supply": _log_slider(supply, hi / 1e4, hi, "supply (samples/s)"),
                "consume": _log_slider(consume, hi / 1e4, hi, "consumption (samples/s)")}

    def compute(supply, consume):
        import pandas as pd

        from preflight.chapters.data_pipeline import IDLE_FAIL, IDLE_WARN
        from preflight.core.findings import worst

        h = M.headroom(supply, consume)
        supply_v = judge(h, warn=M.HEADROOM_RULE, fail=M.HEADROOM_FAIL)[0]
        at_start = measured_idle is not None and abs(supply - supply0) <= 1e-9 * supply0 and \
            abs(consume - consume0) <= 1e-9 * consume0
        extra = {}
        if measured_idle is not None:
            extra["measured_idle"] = ("measured idle at the starting point (jitter, transfer)", f"{measured_idle:.1%}")
            idle_v = judge(measured_idle, warn=IDLE_WARN, fail=IDLE_FAIL, higher_is_better=False)[0]
            extra["chapter"] = ("the chapter's verdict (supply and measured idle)",
                                worst([supply_v, idle_v]) if at_start else "at the starting point only")
        text = readout({"headroom": ("headroom supply/consumption", f"{h:.2f}x"),
                        "idle": ("device idle (steady state, lower bound)", f"{M.idle_share(supply, consume):.1%}"),
                        "verdict": ("1.2x supply rule alone", supply_v), **extra})
        ratios = [10 ** (k / 20) for k in range(-20, 21)]
        df = pd.DataFrame([{"supply / consumption": r, "device idle": M.idle_share(r, 1.0), "curve": "idle share"}
                           for r in ratios])
        return text, charts.curves(df, "supply / consumption", "device idle", "curve", mark_x=h, log_y=False,
                                   title=f"Device idle share vs headroom (red: the {M.HEADROOM_RULE:g}x rule; grey: "
                                         "the sliders)", y_format="%", x_format="~g", rule_x=M.HEADROOM_RULE)

    return explorer(controls, compute, "Supply vs consumption explorer")
