"""The package in wings by role: each wing imports only the wings below it, no import cycle at all
(module level or deferred inside a function), and a short top level."""
import ast
from collections import defaultdict

from conftest import REPO

PKG = REPO / "lib" / "preflight"
# Bottom to top: a module may import its own wing and the wings before it in this list.
WINGS = ["core", "models", "diagnose", "toolkit", "harness", "bench", "chapters", "reporting", "widgets",
         "runner", "cli"]
# The one edge upward, and why: the profile validates zero_stage against the frameworks' ZeRO stages,
# a table the memory formulas own (models.states, pure Python, no import of its own).
# The second: the profile derives a mixture-of-experts model's active parameters from its expert shape
# (models.moe, pure Python as well), so that every chapter reads one count.
# The third: the profile accepts Megatron's recompute modules from the table the memory and step models read
# (models.activations.RECOMPUTE_MODULES, pure Python, no import of its own).
ALLOWED_UP = {("preflight.core.profile", "preflight.models.states"), ("preflight.core.profile", "preflight.models.moe"),
              ("preflight.core.profile", "preflight.models.activations")}


def modules() -> dict[str, ast.Module]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(p.read_text())
    return out


def imports(mods) -> dict[str, set[str]]:
    """Every preflight module each module imports, wherever the import statement is."""
    edges = defaultdict(set)
    for name, tree in mods.items():
        pkg = name if (PKG.parent / name.replace(".", "/") / "__init__.py").exists() else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:                                  # from . import x / from .x import y
                    base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
                if not base.startswith("preflight"):
                    continue
                for a in node.names:
                    edges[name].add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name.startswith("preflight"))
    return edges


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in WINGS else None


def test_no_import_cycle_at_all():
    mods = modules()
    edges = imports(mods)
    seen, stack, cycles = {}, [], []

    def visit(v):
        seen[v] = "open"
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in mods or w == v:
                continue
            if seen.get(w) == "open":
                cycles.append(stack[stack.index(w):] + [w])
            elif w not in seen:
                visit(w)
        stack.pop()
        seen[v] = "done"

    for m in sorted(mods):
        if m not in seen:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_each_wing_imports_only_the_wings_below_it():
    mods = modules()
    bad = []
    for src, targets in imports(mods).items():
        ws = wing(src)
        for dst in targets:
            wd = wing(dst)
            if ws and wd and WINGS.index(wd) > WINGS.index(ws) and (src, dst) not in ALLOWED_UP:
                bad.append(f"{src} -> {dst}")
    assert not bad, "imports upward: " + ", ".join(sorted(bad))


def test_the_top_level_is_short():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 8, top
    assert {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(WINGS[:-1])
