"""One configuration mechanism for every entry point.

A config file is plain Python in `configs/` that defines `get_config()` returning a dataclass (usually one of
the validated dataclasses of the package). Entry points take `--config configs/NAME.py` and any number of
`--set path.to.field=value` overrides; values are parsed as Python literals when they parse, else kept as
strings, then coerced to the field's declared type. Dataclasses validate themselves in `__post_init__`, which
runs again after overrides, so a bad override fails with a message naming the field. Settings several configs
share (the DAPO recipe, the controller's sampling) live once in `configs/recipes.py`, which they load by path
(`load_module`).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import pathlib
import types
import typing
from typing import Any, Sequence


def load_config(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> Any:
  """Loads `get_config()` from a Python config file and applies `key=value` overrides."""
  module = load_module(path)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path} defines no get_config()")
  return apply_overrides(module.get_config(), overrides)


def load_module(path: str | pathlib.Path) -> types.ModuleType:
  """Runs a Python file of `configs/` by its path and returns it as a module: a config, or the settings several
  configs share (`configs/recipes.py`), which a config loads from beside itself,
  `load_module(pathlib.Path(__file__).resolve().parent / "recipes.py")`. WHY by path: `configs/` is not a package
  on `sys.path`, so this works from any directory, in tests, in the ablation runner and on every process."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"config file not found: {path}")
  spec = importlib.util.spec_from_file_location(f"m3jax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def apply_overrides(config: Any, overrides: Sequence[str]) -> Any:
  """Returns a copy of the dataclass `config` with dotted `key=value` overrides applied and re-validated."""
  for item in overrides:
    if "=" not in item:
      raise ValueError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    config = _replace_path(config, key.strip().split("."), raw.strip(), key.strip())
  return config


def _replace_path(obj: Any, parts: list[str], raw: str, full_key: str) -> Any:
  if not dataclasses.is_dataclass(obj):
    raise ValueError(f"cannot override {full_key!r}: {type(obj).__name__} is not a config dataclass")
  fields = {f.name: f for f in dataclasses.fields(obj)}
  name = parts[0]
  if name not in fields:
    raise ValueError(f"unknown config field {full_key!r} (known here: {', '.join(sorted(fields))})")
  current = getattr(obj, name)
  if len(parts) > 1:
    value = _replace_path(current, parts[1:], raw, full_key)
  else:
    hints = typing.get_type_hints(type(obj))
    value = _coerce(_parse_literal(raw), hints.get(name, Any), full_key)
  return dataclasses.replace(obj, **{name: value})


def _parse_literal(raw: str) -> Any:
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    if raw.lower() in ("true", "false"):
      return raw.lower() == "true"
    if raw.lower() in ("none", "null"):
      return None
    return raw


def _coerce(value: Any, hint: Any, key: str) -> Any:
  origin = typing.get_origin(hint)
  if hint is Any or hint is None:
    return value
  if origin in (typing.Union, types.UnionType):
    args = typing.get_args(hint)
    if value is None and type(None) in args:
      return None
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _coerce(value, arg, key)
      except (TypeError, ValueError):
        continue
    raise ValueError(f"override {key}={value!r} does not fit type {hint}")
  if origin is typing.Literal:
    if value not in typing.get_args(hint):
      raise ValueError(f"override {key}={value!r}: expected one of {typing.get_args(hint)}")
    return value
  if origin in (tuple, list):
    if not isinstance(value, (tuple, list)):
      value = (value,)
    args = typing.get_args(hint)
    inner = args[0] if args else Any
    items = [_coerce(v, inner, key) for v in value]
    return tuple(items) if origin is tuple else items
  if hint is bool:
    if isinstance(value, bool):
      return value
    raise ValueError(f"override {key}={value!r}: expected true/false")
  if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value)
  if hint is int and isinstance(value, int) and not isinstance(value, bool):
    return value
  if hint is str:
    return str(value)
  if isinstance(hint, type) and isinstance(value, hint):
    return value
  raise ValueError(f"override {key}={value!r}: expected {getattr(hint, '__name__', hint)}")


def add_config_args(parser) -> None:
  """Adds the standard `--config` / `--set` arguments to an argparse parser."""
  parser.add_argument("--config", required=False, help="Python config file defining get_config()")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field (repeatable), e.g. --set sampler.max_new_tokens=64")
