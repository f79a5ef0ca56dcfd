"""The chapters, one home: number, name, title, finding-id prefix and the modules of each layer.

A chapter has one name in every layer: its notebook ``playbook/NN_<name>.ipynb`` (generated from
``tools/notebooks/NN_<name>.py``), its audit module ``preflight.chapters.<name>``, its sliders
``preflight.widgets.<name>``, its exercises ``preflight.chapters.exercises.<name>``, its test file
``tests/test_chapter_<name>.py``, and its finding ids ``<name>/<metric>``. The models and bench
modules keep the name of what they compute or measure (``models.resilience`` is the failure math,
``bench.datapipe`` measures a data pipe); the registry says which chapter uses which.

Who reads it: the audit (which notebooks exist, in which order, under which title;
``preflight.runner.audit.discover``), the report (each chapter's pitfall in the verdict table),
``preflight compare`` (old finding ids -> current ones, :func:`current_id`), and
``tests/test_registry.py``, which checks that every layer agrees with it: each module and file
listed exists, the notebooks' file names and titles match, every finding id of a plan-only audit
starts with its chapter's prefix, README's Layout and docs/facilitator.md name every chapter.

Adding a sixth chapter (say ``storage``):

1. ``tools/notebooks/06_storage.py`` (first markdown line ``# # Chapter 6: <title>``; its first code
   cell calls ``start("storage", ...)``), then ``python tools/nbgen.py`` writes
   ``playbook/06_storage.ipynb``.
2. ``lib/preflight/chapters/storage.py``: thresholds and ``add_plan_findings`` /
   ``add_measured_findings``, every finding id ``storage/<metric>``; its exercises as
   ``preflight.chapters.exercises.storage``.
3. Sliders, if any, in ``lib/preflight/widgets/storage.py`` (exported from ``preflight.widgets``);
   formulas in ``models/``, measurements in ``bench/`` under the name of what they compute (what
   they run on in ``harness/``), what the user keeps in ``toolkit/``, what reads a real job's
   evidence in ``diagnose/`` (the wings: ``preflight``'s docstring).
4. ``tests/test_chapter_storage.py``.
5. A :class:`Chapter` entry below (number 6, ``prefix="storage"``, ``old_prefixes=()``, every module
   of steps 2-3, the tools it hands the user in ``library``, its pieces in other wings in
   ``support``, the test files in ``tests``).
6. README: a row in "The five chapters" table and the chapter's line in the Layout section (it must
   name every module listed here); docs/facilitator.md: a row in the timing table.
7. ``pytest tests/test_registry.py`` says what is still missing.

Renaming a chapter's finding-id prefix: add the old prefix to ``old_prefixes`` so that
``preflight compare`` still matches an older findings.json's ids to the new ones.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    number: int
    name: str                       # NN_<name>.ipynb; chapters/, widgets/, exercises, test file
    title: str                      # the notebook's heading without "Chapter N: "
    pitfall: str                    # the one pitfall it is about (README, report's verdict table)
    prefix: str                     # of its finding ids: "<prefix>/<metric>"
    old_prefixes: tuple[str, ...]   # published before (findings.json of older versions)
    audit: tuple[str, ...]          # preflight.chapters.* modules it runs (the first emits its findings)
    widgets: str | None             # its sliders module
    models: tuple[str, ...]         # preflight.models.* it uses
    bench: tuple[str, ...]          # preflight.bench.* it measures with (entry points, each runnable alone)
    library: tuple[str, ...]        # what it hands the user: preflight.toolkit.* (its fixes), preflight.diagnose.*
    tests: tuple[str, ...]          # tests/ files of the modules above
    support: tuple[str, ...] = ()   # its own pieces elsewhere: harness/ its benches run on, reporting/, runner/

    @property
    def stem(self) -> str:
        return f"{self.number:02d}_{self.name}"

    @property
    def notebook(self) -> str:
        """The notebook, relative to the repository."""
        return f"playbook/{self.stem}.ipynb"

    @property
    def source(self) -> str:
        """The notebook's source (tools/nbgen.py writes the notebook from it)."""
        return f"tools/notebooks/{self.stem}.py"

    @property
    def heading(self) -> str:
        """The notebook's first heading, and the chapter's title in findings.json."""
        return f"Chapter {self.number}: {self.title}"

    @property
    def exercises(self) -> str:
        """Its predict-then-measure questions: a function of ``preflight.chapters.exercises``."""
        return f"preflight.chapters.exercises.{self.name}"

    @property
    def modules(self) -> tuple[str, ...]:
        """Every library module listed for it, dotted."""
        return (*self.audit, *((self.widgets,) if self.widgets else ()), *self.models, *self.bench,
                *self.library, *self.support)


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(
        1, "baseline", "Baseline before scale", "scaling before a single-device baseline",
        prefix="baseline", old_prefixes=(),
        audit=("preflight.chapters.baseline", "preflight.chapters.memory_plan", "preflight.chapters.workload"),
        widgets="preflight.widgets.baseline",
        models=("preflight.models.flops", "preflight.models.scaling", "preflight.models.extrapolate",
                "preflight.models.memory", "preflight.models.memory_fit", "preflight.models.activations",
                "preflight.models.states", "preflight.models.peers", "preflight.models.moe",
                "preflight.models.throughput"),
        bench=("preflight.bench.ceilings", "preflight.bench.baseline", "preflight.bench.fusion",
               "preflight.bench.scaling", "preflight.bench.memory", "preflight.bench.workload_baseline"),
        library=(),
        tests=("tests/test_chapter_baseline.py", "tests/test_chapter_memory.py", "tests/test_models.py",
               "tests/test_memory_models.py", "tests/test_baseline.py", "tests/test_ceilings.py",
               "tests/test_fusion.py", "tests/test_scaling.py", "tests/test_memory_bench.py",
               "tests/test_memory_layouts.py", "tests/test_memory_peers.py", "tests/test_workload.py", "tests/test_moe.py")),
    Chapter(
        2, "data_pipeline", "The starved data pipeline", "a starved data pipeline",
        prefix="data_pipeline", old_prefixes=("data",),
        audit=("preflight.chapters.data_pipeline",),
        widgets="preflight.widgets.data_pipeline",
        models=("preflight.models.data",),
        bench=("preflight.bench.datapipe", "preflight.bench.loadtune"),
        library=("preflight.toolkit.shards", "preflight.toolkit.shardformat", "preflight.toolkit.shardread",
                 "preflight.toolkit.loadmon"),
        tests=("tests/test_chapter_data_pipeline.py", "tests/test_data_models.py", "tests/test_datapipe.py",
               "tests/test_shards.py", "tests/test_loadmon.py")),
    Chapter(
        3, "communication", "Communication vs computation", "communication not overlapped with compute",
        prefix="communication", old_prefixes=("comm",),
        audit=("preflight.chapters.communication", "preflight.chapters.workload"),
        widgets="preflight.widgets.communication",
        models=("preflight.models.comm", "preflight.models.extrapolate"),
        bench=("preflight.bench.allreduce", "preflight.bench.overlap", "preflight.bench.workload_overlap"),
        library=("preflight.toolkit.hooks", "preflight.diagnose.topology", "preflight.diagnose.nccl_log"),
        tests=("tests/test_chapter_communication.py", "tests/test_models.py", "tests/test_allreduce.py",
               "tests/test_overlap.py", "tests/test_topology.py", "tests/test_workload_audit.py"),
        support=("preflight.harness.emulated",)),
    Chapter(
        4, "load_balance", "Load balance", "load imbalance",
        prefix="load_balance", old_prefixes=("balance",),
        audit=("preflight.chapters.load_balance", "preflight.chapters.memory_plan",   # the bubble's memory
               "preflight.chapters.workload"),
        widgets="preflight.widgets.load_balance",
        models=("preflight.models.padding", "preflight.models.pipeline", "preflight.models.zerobubble",
                "preflight.models.memory", "preflight.models.stragglers"),
        bench=("preflight.bench.padding", "preflight.bench.pipeline", "preflight.bench.partition",
               "preflight.bench.workload_pipeline"),
        library=("preflight.toolkit.sampling",),
        tests=("tests/test_chapter_load_balance.py", "tests/test_pipeline_models.py",
               "tests/test_pipeline_bench.py", "tests/test_sampling.py", "tests/test_zerobubble.py",
               "tests/test_stragglers.py"),
        support=("preflight.harness.stages",)),
    Chapter(
        5, "fault_tolerance", "Fault tolerance", "no fault tolerance",
        prefix="fault_tolerance", old_prefixes=("resilience",),
        audit=("preflight.chapters.fault_tolerance", "preflight.chapters.workload"),
        widgets="preflight.widgets.fault_tolerance",
        models=("preflight.models.resilience", "preflight.models.checkpoint_sim"),
        bench=("preflight.bench.resume", "preflight.bench.ckptstall", "preflight.bench.corruption",
               "preflight.bench.elastic", "preflight.bench.workload_resume"),
        library=("preflight.toolkit.ckpt",),
        tests=("tests/test_chapter_fault_tolerance.py", "tests/test_resilience_models.py",
               "tests/test_resume.py", "tests/test_ckptstall.py", "tests/test_ckpt.py", "tests/test_scratch.py"),
        support=("preflight.runner.scratch", "preflight.reporting.failure_charts")),
)

BY_NUMBER: dict[int, Chapter] = {c.number: c for c in CHAPTERS}
BY_NAME: dict[str, Chapter] = {c.name: c for c in CHAPTERS}

# Finding-id prefixes published by earlier versions -> the current prefix (``preflight compare``).
ID_PREFIX_ALIASES: dict[str, str] = {old: c.prefix for c in CHAPTERS for old in c.old_prefixes}

# Whole finding ids renamed when what they report changed (after the prefix rename): old -> current.
# ``checkpoint_interval_s`` reported the optimal interval while its verdict judged the extra waste of the
# plan's interval; the finding now reports that extra waste (the optimum is ``checkpoint_interval_opt_s``).
ID_ALIASES: dict[str, str] = {
    "fault_tolerance/checkpoint_interval_s": "fault_tolerance/checkpoint_interval_extra_waste",
}


def current_id(finding_id: str) -> str:
    """A finding id as this version names it: ``comm/allreduce_s`` -> ``communication/allreduce_s``,
    ``resilience/checkpoint_interval_s`` -> ``fault_tolerance/checkpoint_interval_extra_waste``; ids
    already current (or of no known chapter) come back unchanged."""
    prefix, sep, metric = finding_id.partition("/")
    full = f"{ID_PREFIX_ALIASES[prefix]}/{metric}" if sep and prefix in ID_PREFIX_ALIASES else finding_id
    return ID_ALIASES.get(full, full)
