"""Memory directories compared by content (m3jax.memorize.pipeline's format), for tests that memorize one video in
several ways (alone, batched with others, on other process counts) and expect the same memory."""

import json
import pathlib

import numpy as np


def _content(path: pathlib.Path) -> dict[str, object]:
  """A memory directory's content: JSON files parsed (the manifest without wall-clock timings), .npz files as
  their arrays, anything else as bytes."""
  out: dict[str, object] = {}
  for f in sorted(path.rglob("*")):
    if f.suffix == ".json":
      data = json.loads(f.read_text())
      if f.name == "manifest.json":
        data.pop("timings", None)
      out[f.relative_to(path).as_posix()] = data
    elif f.suffix == ".npz":
      with np.load(f, allow_pickle=False) as z:
        out[f.relative_to(path).as_posix()] = {k: z[k] for k in z.files}
    elif f.is_file():
      out[f.relative_to(path).as_posix()] = f.read_bytes()
  return out


def assert_same_memory(a: pathlib.Path, b: pathlib.Path) -> None:
  """Same files, same JSON (ids, observations, memories, writer state), same non-float arrays; float arrays (the
  unit embeddings) equal up to the rounding that depends on the batch shape XLA ran them in: ~1e-7 per layer,
  grown to ~5e-5 by GE2E's 160-step LSTM (measured), so 1e-3, far below the ~0.1-1 of another clip's or video's
  embedding."""
  ca, cb = _content(a), _content(b)
  assert ca.keys() == cb.keys() and any(k.startswith("clips/") for k in ca)
  for k, va in ca.items():
    vb = cb[k]
    if isinstance(va, dict) and k.endswith(".npz"):
      assert va.keys() == vb.keys(), k
      for name in va:
        if va[name].dtype.kind == "f":
          np.testing.assert_allclose(va[name], vb[name], atol=1e-3, rtol=0, err_msg=f"{k}:{name}")
        else:
          np.testing.assert_array_equal(va[name], vb[name], err_msg=f"{k}:{name}")
    else:
      assert va == vb, f"{a.name}/{k} differs"
