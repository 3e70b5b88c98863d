"""Layers that point one way: the imports between the pack's top-level parts.

A part is a top-level folder or module (``sampling``, ``loaders``, ``cli`` ...).
The shipped model's definition (``embedded/``: what ``loaders/embedded.py`` rebuilds it
from) and the programs that train, demo and evaluate it through the loaders
(``embedded_tools/``) are two folders on two layers.

The graph is read from the source tree: every ``.py`` outside ``tests/``, relative
imports and absolute ``spec_ar.`` ones, imports inside functions included (they
run too).  Each failure names the importing file and line.
"""
from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIP = {"tests", "build", "out", "__pycache__"}

#: lowest first; a part imports only parts of lower layers
LAYERS = [
    {"formats"},  # checkpoint files
    {"sampling"},  # the engine
    {"charts", "prompt_files", "output_folders"},  # small helpers several surfaces share
    {"decoders"},  # VQ decoders
    {"embedded"},  # the shipped model: its definition, world and judge
    {"loaders"},  # model families -> engine adapters
    {"embedded_tools"},  # training, demo and evaluation of the shipped model
    {"training"},  # draft heads for any model (the embedded one's prompts come from its world)
    {"bench", "benchmarks"},
    {"workflows"},  # ComfyUI's workflow formats
    {"nodes"},  # ComfyUI nodes
    {"cli"},  # spec-ar and its batch and queue commands
    {"__init__"},  # ComfyUI's entry point
]


def sources() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if not any(part in SKIP or part.startswith(".") for part in p.relative_to(ROOT).parts))


def module_of(path: pathlib.Path) -> str:
    """``loaders/detect.py`` -> ``loaders.detect``; ``cli/__init__.py`` -> ``cli``; the root ``__init__.py`` ->
    ``__init__``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def part_of(module: str) -> str:
    return module.partition(".")[0]


def imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` for each import of the pack's own modules in ``path``."""
    module = module_of(path)
    # where a relative import starts: the package itself for an __init__.py; the root for top-level files
    package = "" if path.parent == ROOT else module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name[len("spec_ar."):]) for a in node.names if a.name.startswith("spec_ar.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "spec_ar" or (node.module or "").startswith("spec_ar."):
                target = node.module[len("spec_ar."):] if node.module != "spec_ar" else ""
            else:
                continue
            for alias in node.names:  # `from . import x`: the module x when there is one
                sub = f"{target}.{alias.name}" if target else alias.name
                found.append((node.lineno, sub if is_module(sub) else target))
    return [(line, name) for line, name in found if name]


def graph(group=None) -> dict[tuple[str, str], list[str]]:
    """``(importing part, imported part)`` -> the imports behind that arrow, as
    ``file:line imports module``; ``group`` maps a module to its node (default: its part)."""
    group = group or part_of
    edges = defaultdict(list)
    for path in sources():
        src = group(module_of(path))
        for line, target in imports(path):
            dst = group(target)
            imp = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if dst != src and imp not in edges[src, dst]:  # `from x import a, b`: once
                edges[src, dst].append(imp)
    return dict(edges)


def cycles(edges) -> list[list[str]]:
    """The sets of two or more parts that import each other, directly or not (strongly
    connected components: each holds a cycle), sorted."""
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm; the graph has a dozen nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(set(succ) | {b for a, b in edges}):
        if v not in index:
            visit(v)
    return sorted(found)


def offending(edges, src_parts, allowed) -> list[str]:
    return [imp for (src, dst), imps in sorted(edges.items()) if src in src_parts and not allowed(dst) for imp in imps]


def test_the_graph_is_read_from_the_source():
    edges = graph()
    assert any(imp.startswith("loaders/detect.py:") and imp.endswith("imports formats.checkpoints")
               for imp in edges["loaders", "formats"])
    assert ("decoders", "formats") in edges and ("loaders", "decoders") in edges and ("loaders", "embedded") in edges
    assert any("imports bench.run" in imp for imp in edges["cli", "bench"])  # an import inside a function
    assert any(imp.startswith("__init__.py:") for imp in edges["__init__", "nodes"])  # the entry point's `from .nodes`
    assert ("embedded_tools", "loaders") in edges and ("embedded", "sampling") in edges


def test_the_cycle_finder_finds_cycles():
    assert cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): [], ("d", "e"): [],
                   ("e", "d"): []}) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({("a", "b"): [], ("b", "c"): [], ("a", "c"): []}) == []


def _cycle_report(edges) -> str:
    problems = []
    for group in cycles(edges):
        arrows = [f"  {a} -> {b}: {', '.join(imps)}" for (a, b), imps in sorted(edges.items())
                  if a in group and b in group]
        problems.append(f"{', '.join(group)} import each other:\n" + "\n".join(arrows))
    return "\n".join(problems)


def test_no_cycle_between_top_level_parts():
    problems = _cycle_report(graph())
    assert not problems, "import cycles between top-level parts:\n" + problems


def test_no_cycle_between_modules():
    """Inside a part too (bench/run.py and bench/report.py once imported each other)."""
    problems = _cycle_report(graph(group=lambda module: module))
    assert not problems, "import cycles between modules:\n" + problems


def test_sampling_imports_only_sampling():
    bad = offending(graph(), {"sampling"}, lambda dst: dst == "sampling")
    assert not bad, "sampling/ is the engine and imports nothing else of the pack:\n" + "\n".join(bad)


def test_formats_imports_nothing_of_the_pack():
    bad = offending(graph(), {"formats"}, lambda dst: False)
    assert not bad, "formats/ sits below every other part:\n" + "\n".join(bad)


def test_loaders_and_decoders_import_no_training_bench_or_node_code():
    above = {"embedded_tools", "training", "bench", "benchmarks", "nodes", "cli", "workflows", "__init__"}
    bad = offending(graph(), {"loaders", "decoders"}, lambda dst: dst not in above)
    assert not bad, "loaders/ and decoders/ import training, bench, node or command-line code:\n" + "\n".join(bad)


def test_every_import_points_down_the_layers():
    rank = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    edges = graph()
    parts = {part_of(module_of(path)) for path in sources()} | {part for edge in edges for part in edge}
    unplaced = sorted(parts - set(rank))
    assert not unplaced, f"parts without a layer (add them to LAYERS): {unplaced}"
    bad = [f"{imp} ({src} may not import {dst}: same or higher layer)"
           for (src, dst), imps in sorted(edges.items()) if rank[dst] >= rank[src] for imp in imps]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)
