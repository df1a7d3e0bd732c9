"""The jitted search kernel: every question of a batch against its graph in one call.

Graphs stay at their own capacities (no padded copy of a large graph); requests are grouped by graph and by
route into `[G, R, ...]` blocks, so each question meets only its own graph in a batched matmul and does only its
route's work. Per question the kernel builds the candidate mask (rows visible in the `before_clip` view,
restricted to text alive-linked to the people the query names), scores nodes as the max over back-translated
query variants, and then either aggregates clip scores by sorted-segment max/mean/sum, applies the threshold and
the exclusion of clips already seen (before top-k with backfill, or after top-k as the reference does) and
takes the top clips (clip route), or takes the top node rows, equivalence lines excluded (node route).
Text rows are sorted by clip and edge rows by text row (the graph keeps both invariants), so every segment
reduction runs on sorted indices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from m3jax.memory.schema import FLAG_HIDDEN, FLAG_SEMANTIC



def _variant_scores(q: Float[Array, "N D"], owner: Int[Array, "N"], emb: Float[Array, "T D"],
                    n_requests: int) -> Float[Array, "R T"]:
  """Node score per request = max over its query variants. Variants of all requests are flattened (sorted by
  owning request, padding owned by `n_requests` and dropped), so the matmul does no padded-variant work."""
  sims = jnp.einsum("nd,td->nt", q, emb, precision=jax.lax.Precision.HIGHEST)
  return jax.ops.segment_max(sims, owner, n_requests, indices_are_sorted=True)


def _candidates(score: Float[Array, "T"], related: Int[Array, "K"], cut: Int[Array, ""], before: Int[Array, ""],
                clip: Int[Array, "T"], node: Int[Array, "T"], flags: Int[Array, "T"], e_text: Int[Array, "E"],
                e_ent: Int[Array, "E"], e_w: Float[Array, "E"], no_semantic: bool):
  """Masks one request's scores to its candidates: visible in the view, linked to the people it names."""
  row_ok = (node >= 0) & (node <= cut) & (clip <= before)
  if no_semantic:
    row_ok &= (flags & FLAG_SEMANTIC) == 0
  hit = (e_w > 0) & (e_ent <= cut) & jnp.any(e_ent[:, None] == related[None, :], axis=-1)
  seg = jnp.minimum(e_text, score.shape[0] - 1)              # padding edge rows sort last
  linked = jax.ops.segment_max(hit.astype(jnp.int32), seg, score.shape[0], indices_are_sorted=True) > 0
  cand = row_ok & jnp.where(related[0] >= 0, linked, True)   # names nobody: every visible text is a candidate
  return jnp.where(cand, score, -jnp.inf), cand


def _clip_route(score, related, cut, before, exclude: Int[Array, "X"], clip, node, flags, e_text, e_ent, e_w, *,
                n_clips: int, clip_k: int, clip_mode: str, exclude_first: bool, no_semantic: bool, threshold: float):
  score, cand = _candidates(score, related, cut, before, clip, node, flags, e_text, e_ent, e_w, no_semantic)
  seg = jnp.where(clip >= 0, clip, n_clips - 1)            # rows are in clip order, padding last
  count = jax.ops.segment_sum(cand.astype(jnp.int32), seg, n_clips, indices_are_sorted=True)
  if clip_mode == "max":
    cs = jax.ops.segment_max(score, seg, n_clips, indices_are_sorted=True)
  else:
    cs = jax.ops.segment_sum(jnp.where(cand, score, 0.0), seg, n_clips, indices_are_sorted=True)
    if clip_mode == "mean":
      cs = cs / jnp.maximum(count, 1)
  excluded = jnp.any(jnp.arange(n_clips)[:, None] == exclude[None, :], axis=-1)
  ok = (count > 0) & (cs >= threshold)
  if exclude_first:
    ok &= ~excluded
  clip_scores, clip_ids = jax.lax.top_k(jnp.where(ok, cs, -jnp.inf), clip_k)
  clip_valid = clip_scores > -jnp.inf
  if not exclude_first:
    clip_valid &= ~excluded[clip_ids]
  return clip_ids, clip_valid


def _node_route(score, related, cut, before, clip, node, flags, e_text, e_ent, e_w, *, node_k: int,
                no_semantic: bool, approx: bool):
  score, _ = _candidates(score, related, cut, before, clip, node, flags, e_text, e_ent, e_w, no_semantic)
  k = min(node_k, score.shape[0])
  top = jax.lax.approx_max_k if approx else jax.lax.top_k      # approx_max_k: the TPU's partial-reduce top-k
  scores, rows = top(jnp.where((flags & FLAG_HIDDEN) == 0, score, -jnp.inf), k)
  return (jnp.pad(rows, (0, node_k - k)), jnp.pad(scores, (0, node_k - k), constant_values=-jnp.inf))


@functools.partial(jax.jit, static_argnames=("n_clips", "clip_k", "node_k", "clip_mode", "exclude_first",
                                             "no_semantic", "threshold", "approx"))
def search_batch(clip_requests: tuple, node_requests: tuple, graphs: tuple, *, n_clips: int, clip_k: int,
                 node_k: int, clip_mode: str, exclude_first: bool, no_semantic: bool, threshold: float,
                 approx: bool = False):
  """One call for all requests.

  clip_requests: (q [G,N,D] flattened variants, owner [G,N] request of each variant, related [G,R,K], cut [G,R],
  before [G,R], exclude [G,R,X]); node_requests: the same without `exclude` (R = 0 allowed); graphs: per graph
  (emb [T,D], clip [T], node [T], flags [T], e_text [E], e_ent [E], e_w [E]).
  Returns (clip ids [G,R,clip_k], clip valid [G,R,clip_k]) and (node rows [G,R',node_k], scores [G,R',node_k]).
  """
  clip_fn = jax.vmap(functools.partial(_clip_route, n_clips=n_clips, clip_k=clip_k, clip_mode=clip_mode,
                                       exclude_first=exclude_first, no_semantic=no_semantic, threshold=threshold),
                     in_axes=(0,) * 5 + (None,) * 6)
  node_fn = jax.vmap(functools.partial(_node_route, node_k=node_k, no_semantic=no_semantic, approx=approx),
                     in_axes=(0,) * 4 + (None,) * 6)
  clip_out, node_out = [], []
  for g, (emb, *rest) in enumerate(graphs):        # unrolled at trace time: each graph keeps its own shapes
    for requests, fn, out in ((clip_requests, clip_fn, clip_out), (node_requests, node_fn, node_out)):
      n_requests = requests[2].shape[1]
      if n_requests:
        score = _variant_scores(requests[0][g], requests[1][g], emb, n_requests)
        out.append(fn(score, *(x[g] for x in requests[2:]), *rest))
  stack = lambda outs: tuple(jnp.stack(p) for p in zip(*outs)) if outs else ()
  return stack(clip_out), stack(node_out)
