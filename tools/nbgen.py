"""Write a chapter notebook from a compact cell list (md/code strings), outputs empty.

Kept so notebooks are reviewed as Python: edit tools/notebooks/NN_name.py, run
``python tools/nbgen.py``. Cells are separated by lines ``# %% [markdown]`` / ``# %%`` (jupytext's
percent format); a code cell whose first line is ``# parameters`` is tagged for papermill.

What a learner sees when the notebook opens:

- the kernel is ``KERNEL`` ("Python (preflight)", the project's virtual environment, which
  ``make setup`` registers), so the documented kernel is the one JupyterLab starts;
- code inputs are collapsed (``{"jupyter": {"source_hidden": true}}``: one click on the cell's bar, or
  View > Expand All Code, shows them), so the results come first, except the cells a learner edits
  (``learner_edits``: the parameters cell and the exercises' ``prediction_... = None`` cells). A collapsed
  cell shows no ``[*]`` prompt: the kernel indicator and each long cell's progress line say what runs.
  The report hides every input anyway.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
KERNEL = {"name": "preflight", "display_name": "Python (preflight)", "language": "python"}   # as the Makefile installs it


def learner_edits(src: str) -> bool:
    """Code the learner is meant to edit, so shown expanded: the parameters and the predictions."""
    return src.startswith("# parameters") or re.search(r"^prediction\w* = None", src, re.M) is not None


def cells_from_percent(text: str):
    cells, kind, buf = [], None, []

    def flush():
        if kind is None:
            return
        src = "\n".join(buf).strip("\n")
        if kind == "markdown":
            src = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in src.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(src))
        else:
            cell = nbformat.v4.new_code_cell(src)
            if src.startswith("# parameters"):
                cell.metadata["tags"] = ["parameters"]
            if not learner_edits(src):
                cell.metadata["jupyter"] = {"source_hidden": True}
            cells.append(cell)

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, buf = ("markdown" if "[markdown]" in line else "code"), []
        else:
            buf.append(line)
    flush()
    return cells


def build(src: Path, dst: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNEL), "language_info": {"name": "python"}}
    nb.cells = cells_from_percent(src.read_text())
    for i, c in enumerate(nb.cells):
        c["id"] = f"{dst.stem[:2]}-{i:03d}"
    nbformat.validate(nb)
    dst.write_text(nbformat.writes(nb) + "\n")


if __name__ == "__main__":
    srcs = [Path(a) for a in sys.argv[1:]] or sorted((REPO / "tools" / "notebooks").glob("*.py"))
    for s in srcs:
        build(s, REPO / "playbook" / (s.stem + ".ipynb"))
        print("wrote", s.stem + ".ipynb")
