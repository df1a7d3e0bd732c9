"""Imports flow one way: models and memory at the bottom, then the generation engine, then perception and data,
then the agent's two jobs (control, then memorize above it: the perception pool asks its episodes' questions with
control's `episode_questions`; control never imports memorize), then the programs (rl, sft, serve, eval), then the
CLI. An upward import (memorize/writers.py -> sft/omni_writer.py was one) ties a low layer to everything above it
and makes circles possible; this test names each one it finds.

Sideways imports within the programs' layer, each for a reason: rl/ pays its reward with the judges
(`eval.judges`, which the evaluation owns), `eval.ablate` runs RL programs (`rl.program`: the ablation's RL rows),
and sft/ scores writers with `eval.scoring`. `test_no_import_cycles` keeps them, and everything else, from closing
a circle, type-only imports included: a reader holds both files of a circle at once whether Python runs the import
or not (the memory graph's helper modules read it through `memory.graph_view.GraphView` instead)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "m3jax"

# m3jax.<first component> -> layer; a module may import from its own layer or any lower one.
LAYERS = {
    "models": 0, "memory": 0, "parallel": 0, "config": 0, "errors": 0, "host_memory": 0, "checkpoint": 0,
    "distributed": 0, "chunks": 0, "compile_cache": 0,
    "engine": 0.5,
    "perception": 1, "data": 1,
    "control": 2,
    "memorize": 2.5,
    "rl": 3, "sft": 3, "serve": 3, "eval": 3,
    "cli": 4,
}


def _layer(module: str) -> int | None:
  parts = module.split(".")
  return LAYERS.get(parts[1]) if len(parts) > 1 and parts[0] == "m3jax" else None


def _imports(tree: ast.AST):
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      yield node.lineno, node.module
    elif isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name


def upward_imports(package: pathlib.Path = PACKAGE) -> list[str]:
  bad = []
  for path in sorted(package.rglob("*.py")):
    module = ".".join(("m3jax",) + path.relative_to(package).with_suffix("").parts)
    own = _layer(module)
    for lineno, target in _imports(ast.parse(path.read_text(), str(path))):
      other = _layer(target)
      if own is not None and other is not None and other > own:
        bad.append(f"m3jax/{path.relative_to(package).as_posix()}:{lineno} imports {target}")
  return bad


def test_every_top_level_module_has_a_layer():
  names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {
      p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
  assert names <= set(LAYERS), f"give these a layer in LAYERS: {sorted(names - set(LAYERS))}"


def test_no_upward_imports():
  assert upward_imports() == []


def test_an_upward_import_is_found(tmp_path):
  (tmp_path / "memorize").mkdir()
  (tmp_path / "memorize" / "writers.py").write_text("def f():\n  from m3jax.sft.omni_writer import load\n")
  assert upward_imports(tmp_path) == ["m3jax/memorize/writers.py:2 imports m3jax.sft.omni_writer"]


def _module_imports(tree: ast.AST):
  """Every absolute import, `if TYPE_CHECKING:` blocks and function-level imports included."""
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      yield node.module, [a.name for a in node.names]
    elif isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, []


def import_cycles(package: pathlib.Path = PACKAGE) -> list[list[str]]:
  """Circles in the module graph, function-level and type-only imports included (a lazy import only hides a
  circle until both halves load; a type-only one still ties the two files together for a reader). `from m3jax.memory import tags` is an edge to m3jax.memory.tags alone: the package's
  `__init__` runs first either way, before the importing module does."""
  modules = {}
  for path in package.rglob("*.py"):
    parts = ("m3jax",) + path.relative_to(package).with_suffix("").parts
    modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  graph = {}
  for module, path in modules.items():
    edges = set()
    for target, names in _module_imports(ast.parse(path.read_text(), str(path))):
      subs = {f"{target}.{n}" for n in names} & modules.keys()
      edges |= subs or ({target} & modules.keys())
    graph[module] = edges - {module}
  index, low, stack, cycles = {}, {}, [], []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return cycles


def test_no_import_cycles():
  assert import_cycles() == []


def test_an_import_cycle_is_found(tmp_path):
  (tmp_path / "memorize").mkdir()
  (tmp_path / "memorize" / "writers.py").write_text("def f():\n  from m3jax.memorize.omni import load\n")  # lazy
  (tmp_path / "memorize" / "omni.py").write_text("from m3jax.memorize import writers\n")
  (tmp_path / "memorize" / "graph.py").write_text("from m3jax.memorize import parts\n")
  (tmp_path / "memorize" / "parts.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "  from m3jax.memorize.graph import Graph\n")  # type-only
  (tmp_path / "memorize" / "alone.py").write_text("from m3jax.memorize.graph import Graph\n")
  (tmp_path / "memorize" / "__init__.py").write_text("from m3jax.memorize.alone import x\n")
  assert import_cycles(tmp_path) == [["m3jax.memorize.graph", "m3jax.memorize.parts"],
                                     ["m3jax.memorize.omni", "m3jax.memorize.writers"]]
