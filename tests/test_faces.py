"""Face detection + embedding on the real portraits shipped with scikit-image and matplotlib."""

import matplotlib.cbook as cbook
import matplotlib.image as mpimg
import numpy as np
import pytest
from skimage import data, transform

from m3jax.perception.faces import DlibFaceBackend, ImageInputError, detect_faces


@pytest.fixture(scope="session")
def portraits():
  astronaut = data.astronaut()
  hopper = np.asarray(mpimg.imread(cbook.get_sample_data("grace_hopper.jpg")))
  small = (transform.rescale(astronaut, 0.6, channel_axis=-1) * 255).round().astype(np.uint8)
  return {"astronaut": astronaut, "astronaut_flip": np.ascontiguousarray(astronaut[:, ::-1]),
          "astronaut_small": small, "hopper": hopper, "hopper_flip": np.ascontiguousarray(hopper[:, ::-1])}


@pytest.fixture(scope="session")
def faces(portraits):
  names = list(portraits)
  found = detect_faces([portraits[n] for n in names])
  return names, found


def test_one_face_per_portrait(portraits, faces):
  names, found = faces
  assert sorted(f.frame_index for f in found) == list(range(len(names)))  # one each, the suit patch filtered
  f = next(f for f in found if names[f.frame_index] == "astronaut")
  x1, y1, x2, y2 = f.bbox
  assert x1 < 220 < x2 and y1 < 120 < y2  # the astronaut's face
  assert f.crop.shape == (y2 - y1, x2 - x1, 3) and f.crop.dtype == np.uint8
  for f in found:
    assert f.embedding.shape == (128,) and abs(np.linalg.norm(f.embedding) - 1) < 1e-5
    assert f.det_score >= 0.5 and f.quality >= 20


def test_same_person_closer_than_different(faces):
  names, found = faces
  emb = {names[f.frame_index]: f.embedding for f in found}
  dist = lambda a, b: float(np.linalg.norm(emb[a] - emb[b]))
  same = [dist("astronaut", "astronaut_flip"), dist("astronaut", "astronaut_small"), dist("hopper", "hopper_flip"),
          dist("astronaut_flip", "astronaut_small")]
  different = [dist(a, b) for a in names if a.startswith("astronaut") for b in names if b.startswith("hopper")]
  assert max(same) < min(different), (same, different)


def test_threads_give_identical_results(portraits, faces):
  names, found = faces
  threaded = DlibFaceBackend(num_threads=2)
  again = detect_faces([portraits[n] for n in names], backend=threaded)
  assert [(f.frame_index, f.bbox) for f in again] == [(f.frame_index, f.bbox) for f in found]
  assert np.abs(np.stack([f.embedding for f in again]) - np.stack([f.embedding for f in found])).max() < 1e-6


def test_no_faces_and_bad_frames(portraits):
  assert detect_faces([]) == []
  assert detect_faces([data.coffee(), np.zeros((64, 64, 3), np.uint8)]) == []
  assert detect_faces([portraits["hopper"]], min_face_size=400) == []  # size filter
  with pytest.raises(ImageInputError, match="frame 1 must be uint8"):
    detect_faces([data.coffee(), portraits["hopper"].astype(np.float32)])
  with pytest.raises(ImageInputError, match="HxWx3"):
    detect_faces([np.zeros((4, 4, 5), np.uint8)])
  with pytest.raises(ImageInputError, match="sequence of frames"):
    detect_faces(portraits["hopper"])
