"""Memory designs as programs: the M3 graph and baselines behind one interface (`base.MemoryDesign`), by name.

  make_design("flat_list", embed_fn, topk=10)      a registered design (every module in this folder registers)
  make_design("my_pkg.my_memory:MyMemory", embed)  a design class anywhere, by import path
  load_design(path, embed_fn)                      a saved design (its `design.json` names it)

Adding a design is one file here: a `MemoryDesign` subclass with a `name`, decorated with `@register`.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import pkgutil
from typing import Any

from m3jax.memory.designs.base import (ClipPerception, DesignError, DesignSearcher, EmbedFn, MemoryDesign,
                                       MANIFEST)

DESIGNS: dict[str, type[MemoryDesign]] = {}


def register(cls: type[MemoryDesign]) -> type[MemoryDesign]:
  if cls.name in DESIGNS and DESIGNS[cls.name] is not cls:
    raise DesignError(f"two memory designs are named {cls.name!r}")
  DESIGNS[cls.name] = cls
  return cls


def design_class(name: str) -> type[MemoryDesign]:
  """A registered design, or `module.path:Class` for one defined outside this folder."""
  if ":" in name:
    module, _, attr = name.partition(":")
    try:
      cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
      raise DesignError(f"cannot import memory design {name!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, MemoryDesign)):
      raise DesignError(f"{name!r} is not a MemoryDesign subclass")
    return cls
  if name not in DESIGNS:
    raise DesignError(f"unknown memory design {name!r} (known: {', '.join(sorted(DESIGNS))})")
  return DESIGNS[name]


def make_design(name: str, embed_fn: EmbedFn, **options: Any) -> MemoryDesign:
  try:
    return design_class(name)(embed_fn, **options)
  except TypeError as e:
    raise DesignError(f"memory design {name!r}: {e}") from None


def load_design(path: str | pathlib.Path, embed_fn: EmbedFn) -> MemoryDesign:
  path = pathlib.Path(path)
  try:
    manifest = json.loads((path / MANIFEST).read_text())
    name, options = manifest["design"], manifest["options"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DesignError(f"no readable memory design at {path} ({type(e).__name__}: {e})") from None
  design = make_design(name, embed_fn, **options)
  design.load_state(path)
  return design


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
  if _module != "base":
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["DESIGNS", "ClipPerception", "DesignError", "DesignSearcher", "MemoryDesign", "design_class",
           "load_design", "make_design", "register"]
