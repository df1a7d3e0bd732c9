"""The decode window's split and write-back alone (`KVCache.layer_window` / `with_window` shapes: 30 layers, 32 rows,
3 KV heads, 1024 slots, a 768-slot window), one slot touched per layer: the whole window stacked back (`cur`),
layer by layer (`each`), only the new slots (`newonly`; XLA may elide parts of the split here, unlike in the
decode loop, whose carry forces it). Session 22.

  PYTHONPATH=. python runs/issue45/probes/window_join_probe.py
"""
import time, functools, jax, jax.numpy as jnp, numpy as np
from m3jax.host_memory import retain_freed_memory
retain_freed_memory()
L, B, K, S, D, W = 30, 32, 3, 1024, 64, 768
def split(x): return tuple(x[i, :, :, :W] for i in range(L))
def join_stack(x, layers): return x.at[:, :, :, :W].set(jnp.stack(layers))
def join_each(x, layers):
  for i, l in enumerate(layers):
    x = jax.lax.dynamic_update_slice(x, l[None], (i, 0, 0, 0, 0))
  return x
def body(layers):  # one fake step: touch one slot per layer (scatter)
  return tuple(l.at[:, :, 5].set(1.0) for l in layers)
def way(join):  # split, one step, then `join` back, for keys and values
  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def f(k, v):
    a, b = body(split(k)), body(split(v))
    return join(k, a), join(v, b)
  return f
@functools.partial(jax.jit, donate_argnums=(0, 1))
def none(k, v):
  return k.at[:, :, :, 5].set(1.0), v.at[:, :, :, 5].set(1.0)
N = 48
start = jnp.asarray(np.random.default_rng(0).integers(300, 700, B), jnp.int32)
def join_new(x, layers):  # write back only slots start..start+N of every row
  pos = start[:, None] + jnp.arange(N)[None]  # [B, N]
  rows = jnp.arange(B)[:, None]
  new = jnp.stack([l[rows, :, jnp.minimum(pos, W - 1)] for l in layers])  # [L, B, N, K, D]
  return x.at[:, rows, :, pos].set(jnp.moveaxis(new, 0, 2), mode="drop")
cur, each, newonly = way(join_stack), way(join_each), way(join_new)
@functools.partial(jax.jit, donate_argnums=(0, 1))
def splitonly(k, v):
  a, b = body(split(k)), body(split(v))
  return k.at[:, :, :, 5].set(a[0][:, :, 5]), v.at[:, :, :, 5].set(b[0][:, :, 5])


def time_ways(ways):
  for name, f in ways:
    k = jnp.zeros((L, B, K, S, D)); v = jnp.zeros((L, B, K, S, D))
    k, v = f(k, v); jax.block_until_ready(k)
    ts = []
    for _ in range(5):
      t = time.perf_counter(); k, v = f(k, v); jax.block_until_ready(k); ts.append(time.perf_counter() - t)
    print(name, f"{np.median(ts)*1e3:.1f} ms", [round(x*1e3) for x in ts])


time_ways([("cur", cur), ("each", each), ("none", none), ("newonly", newonly), ("splitonly", splitonly)])
