"""Persistence, restricted import of reference pickles, JSON export, PYTHONHASHSEED independence."""

import json
import os
import pathlib
import pickle
import pickletools
import subprocess
import sys

import numpy as np
import pytest

from m3jax.memory import GraphError, MemorySearcher, SearchRequest
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.reference_pickle import UnsafePickleError, load_reference_pickle
from m3jax.memory.store import GraphFormatError, load_graph, save_graph

FIX = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"


@pytest.fixture(scope="module")
def embedder():
  return HashedBowEmbedder.from_json(FIX / "small.embedder.json")


def test_save_load_roundtrip(tmp_path, embedder):
  g = load_reference_pickle(FIX / "small.pkl")
  save_graph(g, tmp_path / "g")
  h = load_graph(tmp_path / "g")
  for name in ("node_kind", "text_emb", "text_clip", "edge_weight", "edge_entity"):
    np.testing.assert_array_equal(getattr(g, name).valid, getattr(h, name).valid)
  np.testing.assert_array_equal(g.faces.emb.valid, h.faces.emb.valid)
  assert h.contents == g.contents and h.clip_texts == g.clip_texts
  assert h.characters(4).mappings == g.characters(4).mappings
  reqs = [SearchRequest(0, "Where did Chloe find her math homework?"), SearchRequest(0, "What is the character id of "
                                                                                    "Bob", "node", before_clip=3)]
  assert [r.text for r in MemorySearcher([h], embedder).search(reqs)] == \
      [r.text for r in MemorySearcher([g], embedder).search(reqs)]
  h.add_clip(8, ["<face_3> locks the front door."], ["Equivalence: <face_3>, <voice_1>"], embed_fn=embedder)
  assert h.edge_weight.data[h.edge_of[(int(h.node_slot.data[11]), 3)]] == 9.0     # loaded graphs keep consolidating


def test_newer_or_damaged_files_fail_clearly(tmp_path):
  g = load_reference_pickle(FIX / "small.pkl")
  save_graph(g, tmp_path / "g")
  manifest = json.loads((tmp_path / "g" / "manifest.json").read_text())
  (tmp_path / "g" / "manifest.json").write_text(json.dumps(dict(manifest, version=99)))
  with pytest.raises(GraphFormatError, match="version 99"):
    load_graph(tmp_path / "g")
  save_graph(g, tmp_path / "g")                                 # overwriting replaces the bad copy
  (tmp_path / "g" / "arrays.npz").write_bytes(b"garbage")
  with pytest.raises(GraphFormatError, match="damaged"):
    load_graph(tmp_path / "g")
  save_graph(g, tmp_path / "g")
  (tmp_path / "g" / "text.json").write_text("{")
  with pytest.raises(GraphFormatError, match="damaged"):
    load_graph(tmp_path / "g")
  with pytest.raises(GraphFormatError, match="no saved memory graph"):
    load_graph(tmp_path / "nothing")


class _Evil:
  def __reduce__(self):
    return (os.system, ("touch PWNED",))


def test_malicious_pickles_are_rejected(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  evil = tmp_path / "evil.pkl"
  evil.write_bytes(pickle.dumps({"nodes": _Evil()}, protocol=4))
  with pytest.raises(UnsafePickleError, match="posix.system|os.system|refusing"):
    load_reference_pickle(evil)
  assert not (tmp_path / "PWNED").exists()
  # a pickle that names a module-level builtin (eval) is refused too
  payload = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94."
  (tmp_path / "eval.pkl").write_bytes(payload)
  with pytest.raises(UnsafePickleError, match="builtins.eval"):
    load_reference_pickle(tmp_path / "eval.pkl")
  data = (FIX / "small.pkl").read_bytes()
  assert b"videograph" in data and "STACK_GLOBAL" in {op.name for op, _, _ in pickletools.genops(data)}
  (tmp_path / "cut.pkl").write_bytes(data[: len(data) // 2])
  with pytest.raises(GraphError, match="not a readable"):
    load_reference_pickle(tmp_path / "cut.pkl")


def test_json_export(tmp_path):
  g = load_reference_pickle(FIX / "medium.pkl")
  full, cut = g.to_json(), g.to_json(before_clip=30)
  json.dumps(full)
  assert len(full["nodes"]) == 273 and len(full["edges"]) == 306
  assert full["characters"]["character_2"] == ["face_25", "voice_39", "face_41"]
  assert cut["characters"]["character_5"] == ["voice_33"]
  assert max(n["clip"] for n in cut["nodes"] if "clip" in n) == 30


_SCRIPT = """
import json, numpy as np
from m3jax.memory import GraphConfig, MemoryGraph, MemorySearcher, SearchRequest
from m3jax.memory.fixture_embedder import HashedBowEmbedder
F = "{fixtures}/"
emb = HashedBowEmbedder.from_json(F + "small.embedder.json")
out = {}
for mode in ("paper", "reference"):
  g = MemoryGraph(GraphConfig(text_dim=64, face_dim=8, voice_dim=4, mode=mode))
  rng = np.random.default_rng(0)
  faces = g.add_faces([rng.normal(size=(12, 8)) for _ in range(3)])
  voices = g.add_voices(rng.normal(size=(3, 4)))
  sem = [f"Equivalence: <face_{f}>, <voice_{v}>" for f in faces for v in voices]
  g.add_clip(0, [f"<face_{faces[0]}> and <voice_{voices[1]}> talk."], sem, embed_fn=emb)
  out[mode] = [g.characters().mappings, g.faces.emb.valid.sum().item(),
               MemorySearcher([g], emb).search([SearchRequest(0, "<character_1> talk")])[0].text]
print(json.dumps(out))
"""


def test_results_independent_of_pythonhashseed():
  procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT.replace("{fixtures}", str(FIX))], env=dict(os.environ, PYTHONHASHSEED=seed,
                                                                      JAX_PLATFORMS="cpu"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in ("0", "12345")]
  outs = []
  for p in procs:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    outs.append(out)
  assert outs[0] == outs[1] and "character_" in outs[0]
