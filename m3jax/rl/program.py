"""`train.py rl`: DAPO on the controller's own multi-turn trajectories over memory-QA graphs.

Per step: draw questions from a grain iterator, roll out G trajectories each with the batched controller
(the sampler decodes with the learner's current parameter arrays), judge and shape rewards, keep mixed-outcome
groups (dynamic sampling), build the fixed-shape batch, recompute old log-probs if asked (TAURA's entropies come
from that pass, else from the rollout), compute advantages, and train. The checkpoint holds params, optimizer state, the grain iterator state and the
step; every random choice (question order, sampling seeds, mini-batch shuffles) is a pure function of
(`seed`, step), so a killed run resumes with bit-identical next steps.

On a pod (`mesh` set, one process per host): each round's questions are an interleaved shard of the global
question order (process p draws global positions p, p + P, ...), each process rolls out its share on its own
copy of the current parameters, every trajectory is sampled from a random stream keyed by its global position
in the round (not its row in the local batch), and the rounds' trajectories and rewards are gathered through the
JAX runtime, so dynamic sampling, advantages and the training batch are the same on every process and equal to
the one-process run's. The update runs on the global mesh, each process feeding its rows of that batch;
process 0 writes the logs and plots, every process writes its shards of the orbax checkpoint, whose metadata
holds every process's iterator state (a run resumes on any process count dividing `batch_questions`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import pickle
import shutil
import time
from typing import Any

import grain
import jax
import numpy as np

from m3jax import checkpoint
from m3jax.chunks import ChunkBudget
from m3jax.distributed import gather_objects, global_mesh, interleave, shard, to_host
from m3jax.host_memory import release_executables
from m3jax.control.controller import Controller
from m3jax.eval.judges import JudgeItem, make_judge
from m3jax.control.prompts import END_OF_TURN
from m3jax.data.memory_qa import EpisodeSizes, QARecord, make_task, spread_over_episodes
from m3jax.models.lora import attach, export_adapter_file, load_adapter_file, merged
from m3jax.rl.flops import learner_step_flops
from m3jax.rl import advantages as adv_lib
from m3jax.rl import rollout
from m3jax.rl.dynamic_sampling import DynamicBatcher, Group
from m3jax.rl.learner import Learner
from m3jax.rl.metrics_log import MetricsLog
from m3jax.rl.rewards import reward_components
from m3jax.rl.step_work import StepWork, TimedSearcher, compiled_seconds
from m3jax.rl.config import RLConfig, TinyModel  # noqa: F401  (configs and callers import them from here too)



class RLProgram:
  """Builds everything once; `run()` trains `cfg.steps` steps, resuming from `out_dir/ckpt` when present."""

  def __init__(self, cfg: RLConfig):
    from m3jax.memory.embedders import make_embedder
    from m3jax.memory.search import MemorySearcher, SearchConfig

    import jax
    self.process, self.processes = jax.process_index(), jax.process_count()
    if self.processes > 1 and cfg.mesh is None:
      raise ValueError(f"{self.processes} processes joined: set mesh=(data, fsdp, tensor) over their "
                       f"{jax.device_count()} devices")
    if cfg.rollout_ahead and self.processes > 1:  # its rollouts' gathers would interleave with the update's
      raise ValueError(f"rollout_ahead runs on one process, {self.processes} joined")
    if cfg.batch_questions % self.processes:
      raise ValueError(f"batch_questions={cfg.batch_questions} does not split over {self.processes} processes")
    self.cfg = cfg
    self.mesh = None if cfg.mesh is None else global_mesh(*cfg.mesh)
    self.model, self.tokenizer = load_model(cfg)
    # the frozen initial policy (before any warm start) for the KL term; with LoRA, the model's own frozen base
    self.ref_model = load_model(cfg)[0] if cfg.learner.loss.kl_coef > 0 and not cfg.lora_rank else None
    self.learner = Learner(self.model, cfg.learner, mesh=self.mesh, ref_model=self.ref_model)
    embed = make_embedder(cfg.embedder)
    dim = int(np.asarray(embed(["x"])).shape[-1])
    seeds = list(range(*cfg.train_seeds)) + list(range(*cfg.eval_seeds))
    graphs, records = make_task(seeds, embed, dim, cfg.episode, split=None, sizes=cfg.episode_sizes)
    n_train = cfg.train_seeds[1] - cfg.train_seeds[0]
    self.train_records = [r for r in records if r.memory_id < n_train]
    held = [r for r in records if r.memory_id >= n_train]
    # episodes of drawn sizes: the curve's questions come from every held-out episode, not the first large ones
    self.eval_records = (held[:cfg.eval_questions] if cfg.episode_sizes == EpisodeSizes() else
                         spread_over_episodes(held, cfg.eval_questions))
    self.pool_records, self.pool_stats = self._perception_pool(len(graphs), graphs)
    self.work = StepWork()  # where each step's time goes (`m3jax.rl.step_work`)
    self.searcher = TimedSearcher(MemorySearcher(graphs, embed, SearchConfig()), self.work)
    self.judge = make_judge(cfg.outcome_judge, cfg.judge_model, cfg.http_judge)
    # the strict judge refuses answers naming another candidate of the slot: each question's, by id
    self.distractors = {r.question_id: r.distractors for r in records + self.pool_records}
    # this process's interleaved shard of the global question order: at every draw the processes' questions
    # together are the one-process run's
    self.dataset = self._draws(self.train_records, cfg.seed)
    if self.pool_records:  # a pure function of the seed and the index, like the gold order: resumable
      self.dataset = grain.MapDataset.mix([self.dataset, self._draws(self.pool_records, cfg.seed + 2)],
                                          weights=[1.0 - cfg.pool_ratio, cfg.pool_ratio])
    self.dataset = self.dataset[self.process::self.processes]
    self.batcher = DynamicBatcher(cfg.sampling, cfg.batch_questions, multiple=self.processes)
    self.skipped_questions = 0
    self.stop_ids = tuple(self.tokenizer.encode(END_OF_TURN, add_special_tokens=False))
    self.pad_id = int(self.tokenizer.pad_token_id or 0)
    self.prefill_tokens = self.prefill_tokens_saved = 0  # over every rollout of this program (`Sampler`'s counts)
    self.decode_tokens = self.decode_row_steps = 0  # tokens sampled / batch rows x decode steps run (this process)
    # rollout_ahead: {step: (groups, rollout metrics)} rolled out during the previous step's update
    self._ahead: dict[int, tuple[list[Group], dict[str, float]]] = {}
    self._ahead_pool = concurrent.futures.ThreadPoolExecutor(1) if cfg.rollout_ahead else None

  def _draws(self, records: list[QARecord], seed: int):
    """Endless shuffled passes over `records`, each unanswerable one `unanswerable_repeat` times per pass, and
    each question of a `family_repeat` family k times over (the two multiply)."""
    family = dict(self.cfg.family_repeat)
    unknown = sorted(set(family) - {r.family for r in self.train_records + self.pool_records})
    if unknown:
      raise ValueError(f"family_repeat names families no training question has: {unknown}")
    drawn = records + [r for r in records if r.unanswerable] * (self.cfg.unanswerable_repeat - 1)
    drawn += [r for k in range(1, max(family.values(), default=1)) for r in drawn if family.get(r.family, 1) > k]
    return grain.MapDataset.source(drawn).shuffle(seed=seed).repeat()

  def _perception_pool(self, offset: int, graphs: list) -> tuple[list[QARecord], list[dict]]:
    """The perception pool's questions (ids prefixed `pool:`, memory ids past the gold graphs'), its graphs
    appended to `graphs`, and its per-episode build stats; nothing when `pool_ratio` is 0."""
    c = self.cfg
    if not c.pool_ratio:
      return [], []
    from m3jax.memorize.perception_pool import perceived_episodes
    if self.processes > 1:  # process 0 builds what is missing (pool_dir is shared storage), the others then read
      if self.process == 0:
        perceived_episodes(c.pool_dir, range(*c.pool_seeds), c.pool_episode, c.pool_memorize)
      gather_objects(None)
    pool_graphs, records, _, stats = perceived_episodes(c.pool_dir, range(*c.pool_seeds), c.pool_episode,
                                                        c.pool_memorize, progress=self.process == 0)
    graphs.extend(pool_graphs)
    return [dataclasses.replace(r, question_id=f"pool:{r.question_id}", memory_id=r.memory_id + offset)
            for r in records], stats

  # ------------------------------------------------------------------------------------------- rollouts
  def local_model(self):
    """The policy with the current parameters on this process's first device: the model itself without a mesh;
    on a mesh a host copy of every (possibly sharded, multi-process) array, so each process decodes its own
    rollouts without the others. A collective on a mesh: every process calls it."""
    if self.mesh is None:
      return self.model
    import jax
    from flax import nnx

    graphdef, state = nnx.split(self.model)
    device = jax.local_devices()[0]
    return nnx.merge(graphdef, jax.tree.map(lambda x: jax.device_put(to_host(x), device), state))

  def policy_snapshot(self):
    """The current policy as arrays of its own (LoRA merged in): the learner's update donates its parameter
    buffers, so a rollout running beside it (`rollout_ahead`) must not read them."""
    from flax import nnx

    model = self.local_model()
    snap = merged(model) if model.lora is not None else nnx.clone(model)
    if model.lora is None:
      nnx.update(snap, jax.tree.map(jax.numpy.copy, nnx.state(snap)))
    return jax.block_until_ready(snap)

  def rollout(self, records: list[QARecord], seed: int, greedy: bool = False, group: int | None = None,
              row_ids: list[int] | None = None, model=None):
    """Runs G trajectories per record with `model` (default: the current parameters); returns (trajectories,
    reward parts). `row_ids` (one per trajectory) key each trajectory's sampling stream (see `LLMPolicy`)."""
    from m3jax.control.build import build_policy
    from m3jax.engine.sampling import SamplingConfig

    c = self.cfg
    g = c.group_size if group is None else group
    # on CPU a rollout's prefills run in 64-token pieces over the rows still fed (`Sampler._prefill_pieces`):
    # bench.rl_throughput's prefill went from 79.2 to 53.1 s a step on an Intel Xeon, same trajectories
    sampling = SamplingConfig(max_new_tokens=c.max_new_tokens, greedy=greedy, temperature=c.temperature,
                              top_p=c.top_p, top_k=c.top_k, stop_token_ids=self.stop_ids, seed=seed,
                              prefill_piece=64 if jax.default_backend() == "cpu" else 0,
                              entropy=c.advantage == "taura" and not c.recompute_old_logp)
    model = self.local_model() if model is None else model
    if not records:  # a process without questions (an evaluation set smaller than the pod)
      return [], {}
    # LoRA: decode with the adapters merged into a copy of the weights once per rollout (policy update); on an
    # AMD EPYC a 4-layer d=256 batch-1 decode step took 1.62 ms merged vs 2.08 ms adapting every projection,
    # and the merge 12 ms (~25 steps), while a rollout decodes hundreds of steps
    model = model if model.lora is None else merged(model)
    # the G rows of a group share their first prompt: the sampler prefills it once and forks the cache
    policy = build_policy(model, self.tokenizer, sampling, share_prefix=True, row_ids=row_ids)
    sampler = policy.sampler
    questions = rollout.group_questions(records, g)
    slots = min(c.rollout_slots, len(questions)) if c.rollout_slots and row_ids is not None else None
    trajs = Controller(policy, self.searcher, c.control).run(questions, slots=slots)
    self.prefill_tokens += sampler.prefill_tokens
    self.prefill_tokens_saved += sampler.prefill_tokens_saved
    self.decode_tokens += sampler.decode_tokens
    self.decode_row_steps += sampler.decode_row_steps
    self.work.add_engine(sampler.work)
    t_judge = time.perf_counter()
    verdicts = self.judge.judge([JudgeItem(t.question, t.ground_truth, t.response,
                                           self.distractors.get(t.question_id.rsplit("#", 1)[0], ())) for t in trajs])
    self.work.judge_s += time.perf_counter() - t_judge
    parts = reward_components([float(v.correct) for v in verdicts], [rollout.episode_stats(t) for t in trajs],
                              c.reward)
    parts["judge_invalid"] = np.array([not v.valid for v in verdicts], np.float64)  # logged, not in the total
    return trajs, parts

  def _generate_round(self, it, step: int, round_box: list[int], n: int, model=None):
    """One rollout round: this process's share of the round's `n` questions, then every process's groups
    (gathered), in the global question order. Questions the batcher skips (saturated pass rates) are drawn past,
    up to 4× the share, so a fully saturated data set cannot stall a round."""
    c = self.cfg
    P, G = self.processes, c.group_size
    records, want = [], n // P
    for _ in range(4 * want):
      if len(records) == want:
        break
      r = next(it)
      if self.batcher.skips(r.question_id, step):
        self.skipped_questions += 1
      else:
        records.append(r)
    seed = (c.seed * 1_000_003 + step * 1009 + round_box[0] * 17) % (2**31)
    round_box[0] += 1
    # local question i is the round's global question i * P + process; its trajectories' streams follow from that
    row_ids = [(i * P + self.process) * G + k for i in range(len(records)) for k in range(G)]
    fed, saved = self.prefill_tokens, self.prefill_tokens_saved
    trajs, parts = self.rollout(records, seed, row_ids=row_ids, model=model)
    local = [(trajs[i * G:(i + 1) * G], {k: v[i * G:(i + 1) * G] for k, v in parts.items()})
             for i in range(len(records))]
    shares = gather_objects((local, self.prefill_tokens - fed, self.prefill_tokens_saved - saved))
    self.prefill_tokens = fed + sum(s[1] for s in shares)  # the pod's prefill work
    self.prefill_tokens_saved = saved + sum(s[2] for s in shares)
    return [Group(payload=g, outcomes=g[1]["outcome"], question_id=g[0][0].question_id.rsplit("#", 1)[0])
            for g in interleave([s[0] for s in shares])]

  def evaluate(self) -> float:
    """Held-out accuracy with greedy decoding, one trajectory per question (shared out over the processes)."""
    if not self.eval_records:
      return float("nan")
    _, parts = self.rollout(shard(self.eval_records), seed=0, greedy=True, group=1)
    return float(np.concatenate([o for o in gather_objects(parts.get("outcome", np.zeros(0)))]).mean())

  def eval_metrics(self) -> dict[str, float]:
    """`evaluate()` as the curve logs it: the accuracy and how many questions it is over (its interval's n)."""
    return {"eval/accuracy": self.evaluate(), "eval/n": float(len(self.eval_records))}

  # ------------------------------------------------------------------------------------------- training
  def warm_start(self, ckpt: checkpoint.Checkpointer | None = None,
                 budget: ChunkBudget | None = None) -> list[dict[str, float]]:
    """`warm_start_steps` behaviour-cloning steps, then a fresh DAPO learner (`warm_start.clone`)."""
    from m3jax.rl.warm_start import clone
    return clone(self, ckpt, budget)

  def _collect(self, it, step: int, model=None) -> tuple[list[Group], dict[str, float]]:
    """Step `step`'s groups (dynamic sampling over rollout rounds, sampled with `model`, default the current
    policy) and the metrics of their rollout."""
    t0 = time.perf_counter()
    fed, saved, work = self.prefill_tokens, self.prefill_tokens_saved, self.work.totals()
    self.skipped_questions = 0
    groups, stats = self.batcher.fill(lambda n, box=[0]: self._generate_round(it, step, box, n, model), step)
    metrics = dict(stats)
    metrics["ds/skipped_questions"] = float(self.skipped_questions)
    metrics["time/rollout_s"] = time.perf_counter() - t0
    metrics.update(self.work.since(work))
    metrics["rollout/prefill_tokens"] = float(self.prefill_tokens - fed)
    metrics["rollout/prefill_tokens_saved"] = float(self.prefill_tokens_saved - saved)
    return groups, metrics

  def train_step(self, it, step: int) -> dict[str, float]:
    """One DAPO step. With `rollout_ahead` its groups were rolled out during the previous step's update (when
    that step trained), and this step's update runs beside the rollout of step + 1's."""
    c = self.cfg
    released = release_executables()  # a long run meets many shapes: stay under the process's map limit
    work = self.work.totals()
    ahead = self._ahead.pop(step, None)
    groups, metrics = ahead if ahead is not None else self._collect(it, step)
    if c.rollout_ahead:  # 1: time/rollout_s was spent beside the previous step's update
      metrics["rollout/ahead"] = float(ahead is not None)
    metrics["perf/released_executables"] = float(released)  # depends on the process, not the run
    if not groups:
      metrics["train/skipped_empty_batch"] = 1.0
      return metrics
    trajs = [t for g in groups for t in g.payload[0]]
    parts = {k: np.concatenate([g.payload[1][k] for g in groups]) for k in groups[0].payload[1]}
    for k, v in parts.items():
      metrics[f"reward/{k}"] = float(v.mean())
    metrics["rollout/response_tokens"] = float(np.mean([np.sum(t.generated) for t in trajs]))
    metrics["rollout/searches"] = float(np.mean([t.num_searches for t in trajs]))
    metrics["rollout/answered"] = float(np.mean([t.finished for t in trajs]))
    rows = c.batch_questions * c.group_size
    batch, bstats = rollout.build_batch(trajs, rows, seq_bucket=c.seq_bucket, max_len=c.max_seq_len,
                                        pad_id=self.pad_id)
    metrics.update(bstats)
    t1 = time.perf_counter()
    # TAURA's entropies: from the learner's pass when it recomputes the old log-probs anyway, else from the
    # rollout, which recorded them under the same policy the sampler's log-probs come from (no second forward pass)
    entropy = batch.pop("entropy")
    if c.recompute_old_logp:
      logp, entropy = self.learner.logprobs(batch)
      batch["old_logp"] = logp * batch["mask"]
    if c.learner.loss.kl_coef > 0:
      batch["ref_logp"] = self.learner.logprobs(batch, reference=True)[0] * batch["mask"]
    total = np.zeros((rows,), np.float32)
    total[:len(trajs)] = parts["total"]
    seq_adv = np.zeros((rows,), np.float32)
    seq_adv[:len(trajs)] = np.asarray(adv_lib.grpo_advantages(total[:len(trajs)], c.group_size))
    if c.advantage == "taura":
      adv = adv_lib.token_advantages(seq_adv, batch["mask"], entropy=entropy, turn_ids=batch["turn_ids"],
                                     num_turns=c.max_rounds, max_weight=c.taura_max_weight)
    else:
      adv = adv_lib.token_advantages(seq_adv, batch["mask"])
    batch["advantages"] = np.asarray(adv, np.float32)
    del batch["turn_ids"]
    following = None
    if self._ahead_pool is not None and step < c.steps:
      following = self._ahead_pool.submit(self._collect, it, step + 1, self.policy_snapshot())
    t2 = time.perf_counter()
    history = self.learner.update(batch, seed=(c.seed * 7919 + step) % (2**31))
    metrics["time/update_s"] = time.perf_counter() - t2
    dt = time.perf_counter() - t1
    if following is not None:
      self._ahead[step + 1] = following.result()
      metrics["time/ahead_wait_s"] = time.perf_counter() - t1 - dt  # the rollout's time past the update's end
    for k in history[0]:
      metrics[f"train/{k}"] = float(np.mean([h[k] for h in history]))
    metrics["train/skipped_total"] = float(self.learner.skipped_steps)
    metrics["time/learn_s"] = dt
    metrics.update({f"time/{k}": v - work[k] for k, v in compiled_seconds().items()})  # the whole step's compiling
    metrics["perf/learn_tokens_per_s"] = float(batch["lengths"].sum()) * len(history) / c.learner.mini_batches / dt
    flops = learner_step_flops(self.model.cfg, batch["lengths"], int(batch["mask"].sum()), c.lora_rank,
                               c.lora_targets)["total"] * c.learner.epochs
    metrics["perf/learn_model_gflop_s"] = flops / dt / 1e9  # model FLOPs (`m3jax.rl.flops`) per second
    return metrics

  def run(self) -> list[dict[str, float]]:
    """Trains to `steps` from the newest checkpoint, or until the chunk's budget (`chunk`) is spent; then
    `self.summary` says where the run stands (`step`, `start_step`, `finished`, `progress`)."""
    from tqdm import tqdm

    c = self.cfg
    budget = ChunkBudget(c.chunk)
    out = pathlib.Path(c.out_dir)
    lead = self.process == 0  # writes the logs, plots and the adapter; every process writes checkpoint shards
    ckpt = checkpoint.Checkpointer(out / "ckpt", max_to_keep=c.keep_checkpoints)
    it = iter(self.dataset)
    start, restored = 0, ckpt.latest_step() is not None
    if restored:
      state, meta = ckpt.restore(self.learner.state())
      self.learner.restore(state)
      it.set_state(self._data_state(meta["data"]))
      if "batcher" in meta:
        self.batcher.restore(meta["batcher"])
      start = int(meta["step"])
      if "ahead" in meta:  # step start + 1's groups, rolled out before the checkpoint (whatever rollout_ahead is now)
        path = self._ahead_path(start)
        if not path.is_file():
          raise checkpoint.CheckpointError(f"checkpoint {start} needs {path} (the next step's rollouts): not found")
        self._ahead = {start + 1: pickle.loads(path.read_bytes())}
    self.summary = {"start_step": start, "step": start, "steps": c.steps, "finished": False}
    self.progress = ""
    log = MetricsLog(out, resume_step=start if restored else -1) if lead else None
    first = None  # the curve's step 0: the warm start's last metrics and the accuracy DAPO starts from
    if not restored:
      first = self._warm_start_saved(ckpt, it, budget) if c.warm_start_steps else {}
      if first is None:  # the chunk ended inside the warm start (its own checkpoint holds the cloner)
        return self._end_chunk(ckpt, log, [], dapo=False)
      if c.warm_start_steps and self._chunk_over(budget):  # the next chunk starts with the step-0 evaluation
        return self._end_chunk(ckpt, log, [], dapo=True)
    elif start == 0 and not gather_objects(lead and log.logged(0))[0]:  # died in the step-0 evaluation (process
      first = dict(meta.get("warm", {}))                                # 0's log decides, for every process)
    if first is not None and (c.warm_start_steps or c.eval_every):
      if c.eval_every:  # the policy DAPO starts from, so the gain from RL itself shows
        first.update(self.eval_metrics())
      if lead:
        log.write(0, first)
    history, saved = [], start
    step = start
    for step in tqdm(range(start + 1, c.steps + 1), initial=start, total=c.steps, desc="rl", unit="step",
                     disable=not lead):
      if self._chunk_over(budget):
        step -= 1
        break
      metrics = self.train_step(it, step)
      if c.eval_every and step % c.eval_every == 0:
        metrics.update(self.eval_metrics())
      if lead:
        log.write(step, metrics)
      history.append(metrics)
      budget.step_done()
      if step % c.save_every == 0 or step == c.steps:
        self._save(ckpt, step, it)
        saved = step
    if step != saved:  # the chunk's end: its last step is the state the next chunk continues from
      self._save(ckpt, step, it)
    self.summary["step"] = step
    return self._end_chunk(ckpt, log, history, dapo=True)

  def _save(self, ckpt: checkpoint.Checkpointer, step: int, it) -> None:
    # every process's iterator state (gathered: process 0 writes the metadata)
    meta = {"step": step, "data": gather_objects(it.get_state()), "batcher": self.batcher.state()}
    if step + 1 in self._ahead:  # already drawn and rolled out: the next step trains on them, resumed or not
      path = self._ahead_path(step)
      path.parent.mkdir(parents=True, exist_ok=True)
      part = path.with_suffix(".part")
      part.write_bytes(pickle.dumps(self._ahead[step + 1]))
      part.replace(path)  # written before the checkpoint that names it
      meta["ahead"] = path.name
    ckpt.save(step, self.learner.state(), meta)
    self._prune_ahead(ckpt)

  def _ahead_path(self, step: int) -> pathlib.Path:
    """Where checkpoint `step` keeps the groups of step + 1 that `rollout_ahead` had rolled out."""
    return pathlib.Path(self.cfg.out_dir) / "ahead" / f"{step}.pkl"

  def _prune_ahead(self, ckpt: checkpoint.Checkpointer) -> None:
    kept = {self._ahead_path(s) for s in ckpt.steps()}
    for path in (pathlib.Path(self.cfg.out_dir) / "ahead").glob("*.pkl"):
      if path not in kept:
        path.unlink()

  def _chunk_over(self, budget: ChunkBudget) -> bool:
    """Whether this chunk stops before its next step: process 0's clock decides for every process."""
    return bool(gather_objects(budget.exhausted())[0])

  def _end_chunk(self, ckpt: checkpoint.Checkpointer, log: MetricsLog | None, history: list[dict[str, float]],
                 dapo: bool) -> list[dict[str, float]]:
    """Closes the chunk: the curve's PNG, the checkpoints pruned to the newest when the run goes on (what a
    commit of out_dir carries), with LoRA `adapter.npz` as of the step reached, and the summary."""
    c = self.cfg
    step = self.summary["step"]
    self.summary["finished"] = dapo and step >= c.steps
    if not self.progress:
      self.progress = f"step {step}/{c.steps}"
    self.summary["progress"] = self.progress
    if log is not None:
      log.plot()
      log.close()
    if self.process == 0 and not self.summary["finished"]:
      ckpt.prune()
      self._prune_ahead(ckpt)
    ckpt.close()
    if c.lora_rank and dapo:
      self._export_adapter({**self.adapter_meta(), "steps": step})
    return history

  def _export_adapter(self, meta: dict[str, Any]) -> None:
    model = self.local_model()  # a collective on a mesh
    if self.process == 0:
      export_adapter_file(pathlib.Path(self.cfg.out_dir) / "adapter.npz", model, "controller", meta)

  def _warm_start_saved(self, ckpt: checkpoint.Checkpointer, it, budget: ChunkBudget) -> dict[str, float] | None:
    """The warm start (resumable from `out_dir/warm_ckpt`), then at once a step-0 checkpoint of the DAPO
    learner and, with LoRA, `adapter.npz`: a crash in the evaluation or in DAPO keeps the cloned policy and a
    restart does not clone again. Returns the step-0 metrics, or None when the chunk ended inside the warm
    start."""
    out = pathlib.Path(self.cfg.out_dir)
    warm_ckpt = checkpoint.Checkpointer(out / "warm_ckpt", max_to_keep=self.cfg.keep_checkpoints)
    warm = self.warm_start(warm_ckpt, budget)
    if len(warm) < self.cfg.warm_start_steps:
      if self.process == 0:
        warm_ckpt.prune()
      warm_ckpt.close()
      return None
    warm_ckpt.close()
    first = {f"warm/{k}": v for k, v in warm[-1].items()}
    ckpt.save(0, self.learner.state(), {"step": 0, "data": gather_objects(it.get_state()), "warm": first})
    if self.process == 0:
      shutil.rmtree(out / "warm_ckpt", ignore_errors=True)  # superseded by the step-0 checkpoint
    if self.cfg.lora_rank:
      self._export_adapter({**self.adapter_meta(), "steps": 0})
    return first

  def _data_state(self, saved) -> dict[str, Any]:
    """This process's iterator state from a checkpoint's: its own when the process count is unchanged, else
    recomputed from the number of questions drawn so far (the shards advance in lockstep, and the global order
    is a pure function of the seed). A one-process checkpoint of before per-process states holds one dict."""
    states = [saved] if isinstance(saved, dict) else list(saved)
    if len(states) == self.processes:
      return states[self.process]
    drawn = sum(int(s["next_index"]) for s in states)
    if drawn % self.processes:
      raise ValueError(f"the checkpoint's {len(states)} processes drew {drawn} questions, which do not split "
                       f"over {self.processes} processes")
    return dict(states[0], next_index=drawn // self.processes)

  def adapter_meta(self) -> dict[str, Any]:
    """What an answerer needs to run the adapter the way it was trained: base model and protocol."""
    c = self.cfg
    return {"base_model": c.model, "max_rounds": c.max_rounds, "inter_turn_instruction": c.inter_turn_instruction,
            "max_new_tokens": c.max_new_tokens, "embedder": c.embedder, "steps": c.steps, "seed": c.seed,
            "train_seeds": list(c.train_seeds), "warm_start_steps": c.warm_start_steps,
            "warm_start_expert": c.warm_start_expert, "init_adapter": pathlib.Path(c.init_adapter).name,
            "pool_seeds": list(c.pool_seeds), "pool_ratio": c.pool_ratio}


def load_model(cfg: RLConfig):
  from flax import nnx

  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.models.llm import DEFAULT_LLM, load_llm
  from m3jax.models.tokenizer import load_tokenizer
  from m3jax.models.weights.gguf import smollm2_path

  if cfg.model != "tiny":
    model, tok = load_llm(cfg.model if cfg.model != "smollm2" else DEFAULT_LLM, attention_chunk=cfg.attention_chunk)
  else:
    tok = load_tokenizer(smollm2_path())
    t = cfg.tiny
    dcfg = DecoderConfig(vocab_size=len(tok), hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                         num_layers=t.num_layers, num_heads=t.num_heads, num_kv_heads=t.num_kv_heads,
                         head_dim=t.head_dim, tie_embeddings=True, model_type="llama",
                         attention_chunk=cfg.attention_chunk)
    model = Decoder(dcfg, rngs=nnx.Rngs(cfg.seed))
  if not cfg.init_adapter:
    return attach(model, cfg.lora, seed=cfg.seed), tok
  model, info = load_adapter_file(cfg.init_adapter, model, "controller", seed=cfg.seed)
  found = (int(info["rank"]), float(info["alpha"]), tuple(info["targets"]))
  if found != (cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets)):
    raise ValueError(f"init_adapter {cfg.init_adapter}: rank/alpha/targets {found}, the config asks for "
                     f"{(cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets))}")
  return model, tok


def main(cfg: RLConfig) -> dict[str, Any]:
  """Runs one chunk; the summary's `chunk` says where the run stands (`m3jax.chunks`)."""
  program = RLProgram(cfg)
  history = program.run()
  return {"steps": len(history), "last": history[-1] if history else {}, "chunk": program.summary}
