"""Portable parity bounds: m3jax's float32 error is judged against the reference implementation's own float32 error
in the same run, both measured from a float64 run of the reference.

Why: a fixed absolute bound (`max|ours - ref| <= 1e-4`) encodes one CPU's rounding. The same float32 program lands
at a different distance from the exact value on AMD Zen 4 and on Intel AVX-512/AMX (other kernels, other
summation orders), so such a bound had 10% headroom on one machine and failed on the next. What is portable is the
ratio: a correct port of the same computation in float32 is about as far from the exact (float64) value as the
reference's own float32 run on that machine; a wrong one (an eps, a rope frequency, a missing bias) is orders of
magnitude further. A floor relative to the value scale keeps the bound meaningful when the reference's error is
(near) zero, e.g. a computation exact in float32 for that input.
"""

import numpy as np

F32_FLOOR = 1e-6  # ~8 float32 ulps of the largest value: the least error a float32 port can be asked for
# How much further from float64 than the reference's own float32 m3jax may land. Measured on AMD Zen 4: 0.3-2.1
# (the largest: Whisper tiny.en, whose XLA encoder is ~1.5x noisier in RMS than torch's); moving to an Intel
# AVX-512 machine took SmolLM2 from 1.0 to 2.1 (torch's float32 got more accurate there, XLA's less). A wrong
# implementation lands far beyond: RMSNorm eps x2 gave 300-5000, rope theta x1.001 4-200.
MAX_FACTOR, RMS_FACTOR = 4.0, 3.0
# Log-spectra turn a float32 FFT's error, relative to a frame's energy, into an absolute error that is largest in
# its quietest bins: one such bin can be 8.5e-6 off in m3jax (XLA's FFT) while torch's happens to be 1.3e-6 there
# (Omni log-mels of white noise, RMS ratio 1.4). Their max error is floored at ~40 float32 ulps of the largest value.
LOG_SPECTRUM_FLOOR = 1e-5


def _f64(x):
  return np.asarray(x, np.float64)


def _rms(x):
  return float(np.sqrt(np.mean(np.square(x))))


def _ratio(a, b):
  return a / b if b > 0 else (0.0 if a == 0 else np.inf)


def assert_close_to_reference(ours, ref32, ref64, *, max_factor=MAX_FACTOR, rms_factor=RMS_FACTOR,
                              floor=F32_FLOOR, what="values"):
  """Assert that `ours` (m3jax float32) is within `max_factor` x the reference's float32 max error and `rms_factor`
  x its RMS error, both from the reference's float64 output `ref64`; the max bound is at least `floor` x max|ref64|,
  the RMS one F32_FLOOR x RMS(ref64) (a floor on the max scale would let a systematic error hide under the noise).
  Returns the two ratios (ours / reference error) and prints them (visible with `pytest -rP`); a ratio above its
  factor passes only under the floor."""
  ours, ref32, ref64 = _f64(ours), _f64(ref32), _f64(ref64)
  assert ours.shape == ref32.shape == ref64.shape and ours.size, (what, ours.shape, ref32.shape, ref64.shape)
  scale, rms_scale = float(np.abs(ref64).max()), _rms(ref64)
  err, ref_err = ours - ref64, ref32 - ref64
  ours_max, ref_max = float(np.abs(err).max()), float(np.abs(ref_err).max())
  ours_rms, ref_rms = _rms(err), _rms(ref_err)
  max_bound, rms_bound = max(max_factor * ref_max, floor * scale), max(rms_factor * ref_rms, F32_FLOOR * rms_scale)
  ratios = _ratio(ours_max, ref_max), _ratio(ours_rms, ref_rms)
  report = (f"{what}: from float64, m3jax max {ours_max:.3g} rms {ours_rms:.3g}; reference float32 max {ref_max:.3g} "
            f"rms {ref_rms:.3g}; ratios {ratios[0]:.2f} / {ratios[1]:.2f} (bounds {max_factor} / {rms_factor}, "
            f"floors {floor:g} x max {scale:.3g} / {F32_FLOOR:g} x rms {rms_scale:.3g})")
  print(report)
  assert np.isfinite(err).all() and ours_max <= max_bound and ours_rms <= rms_bound, report
  return ratios


def assert_close_to_scale(ours, ref, *, rel, what="values"):
  """For references that cannot be run in float64: max|ours - ref| <= rel x max|ref|. Callers say in a comment why
  no float64 reference exists and what `rel` allows for."""
  ours, ref = _f64(ours), _f64(ref)
  assert ours.shape == ref.shape and ours.size, (what, ours.shape, ref.shape)
  scale, err = float(np.abs(ref).max()), float(np.abs(ours - ref).max())
  report = f"{what}: max error {err:.3g} = {err / max(scale, 1e-300):.3g} x scale {scale:.3g} (bound {rel:g} x scale)"
  print(report)
  assert np.isfinite(ours).all() and err <= rel * scale, report
  return err / max(scale, 1e-300)


def torch_f32_f64(module, run):
  """`run(module, dtype)` on the float32 torch module and on a float64 copy of it (no grad): the reference's float32
  output and its float64 one, as numpy. `run` casts its floating inputs to `dtype`."""
  import copy

  import torch

  with torch.no_grad():
    return (run(module, torch.float32).detach().numpy(),
            run(copy.deepcopy(module).double(), torch.float64).detach().numpy())
