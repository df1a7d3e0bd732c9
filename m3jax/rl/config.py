"""`RLConfig`: every setting of a `train.py rl` run, validated when it is made (the run's program is
`m3jax.rl.program`; configs/rl_*.py build this)."""

from __future__ import annotations

import dataclasses

from m3jax.control.controller import ControlConfig
from m3jax.eval.judges import JUDGES, HTTPJudgeConfig
from m3jax.memorize.pipeline import MemorizeConfig
from m3jax.chunks import ChunkConfig
from m3jax.data.episodes import EpisodeConfig
from m3jax.data.memory_qa import EpisodeSizes
from m3jax.data.questions import check_split
from m3jax.distributed import DistributedConfig
from m3jax.models.lora import LoRAConfig
from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig
from m3jax.rl.rewards import RewardConfig
from m3jax.rl.warm_start import EXPERT_STYLES


@dataclasses.dataclass(frozen=True)
class TinyModel:
  """A random-init decoder (with the SmolLM2 ChatML tokenizer) for plumbing runs and benchmarks."""
  hidden_size: int = 64
  intermediate_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16


@dataclasses.dataclass(frozen=True)
class RLConfig:
  model: str = "tiny"  # "tiny" (random TinyModel) or a load_llm name/path (smollm2-135m-instruct, HF dir, GGUF)
  tiny: TinyModel = TinyModel()
  embedder: str = "hashed"  # the built-in hashed bag-of-words embedder, "minilm", or a *.embedder.json spec
  # episode seeds [lo, hi): training graphs from the train split, evaluation graphs from the held-out split
  # (seeds >= questions.HELDOUT_SEED_START: unseen episodes, phrasings and family), each checked
  train_seeds: tuple[int, int] = (0, 32)
  eval_seeds: tuple[int, int] = (1_000_000, 1_000_008)
  episode: EpisodeConfig = EpisodeConfig()
  # clips and people of each training / curve episode, drawn per seed (`memory_qa.EpisodeSizes`; default: `episode`'s)
  episode_sizes: EpisodeSizes = EpisodeSizes()
  # perception-built memories (`m3jax.memorize.perception_pool`): train-split episodes [lo, hi) in `pool_episode`'s
  # shape (default the demo's), rendered and memorized end to end with `pool_memorize` (faces, voices, Whisper,
  # the default writer) and cached under `pool_dir` (built once, reused and grown across runs); DAPO then draws
  # a question of that pool with probability `pool_ratio`, a gold graph's otherwise (0 = gold graphs only). Its
  # memories are embedded with MiniLM, so the pool needs embedder="minilm"; the warm start stays on gold graphs
  pool_seeds: tuple[int, int] = (0, 0)
  pool_ratio: float = 0.0
  pool_dir: str = "runs/perception_pool"
  pool_episode: EpisodeConfig = EpisodeConfig(num_clips=4, num_characters=2)
  pool_memorize: MemorizeConfig = MemorizeConfig()
  steps: int = 10
  # DAPO draws each unanswerable training question this many times per pass over the training questions (1: as
  # generated, about one in six); more draws give the policy more chances to learn to decline
  unanswerable_repeat: int = 1
  # (family, k) pairs: each training question of that family (`QARecord.family`) is drawn k times per pass, on top
  # of `unanswerable_repeat` (the two multiply); a curriculum toward the families the policy loses
  family_repeat: tuple[tuple[str, int], ...] = ()
  batch_questions: int = 4  # groups per training batch
  group_size: int = 2  # G trajectories per question (the reference: 2)
  max_rounds: int = 5
  inter_turn_instruction: bool = True  # False: the instruction only in the first user message (ControlConfig)
  max_new_tokens: int = 256  # per turn
  temperature: float = 0.6
  top_p: float = 0.95
  top_k: int = 20
  # "" = reward.judge (default strict); set, it overrides that: exact | contains | strict | f1 | choice (rules),
  # llm (the reference's entailment judge on a frozen local LLM, `judge_model`), http (an OpenAI-compatible
  # server, `http_judge`)
  judge: str = ""
  judge_model: str = "smollm2-135m-instruct"
  http_judge: HTTPJudgeConfig = HTTPJudgeConfig()
  advantage: str = "grpo"  # grpo | taura
  taura_max_weight: float | None = 3.0
  recompute_old_logp: bool = True  # False: the sampler's log-probs are the old policy
  seq_bucket: int = 256
  max_seq_len: int = 8192
  # the policy attends in query blocks of this size (0 = one block): a training sequence never materialises
  # [B, H, T, T] scores and skips the masked upper triangle of blocks (models.causal_attention); on CPU the
  # SmolLM2-shaped learner step at T=1024 runs ~1.6x faster with 128 than unchunked
  attention_chunk: int = 128
  reward: RewardConfig = RewardConfig()
  sampling: DynamicSamplingConfig = DynamicSamplingConfig()
  learner: LearnerConfig = LearnerConfig()
  # behaviour-cloning warm start (`m3jax.rl.warm_start`) before the first DAPO step of a fresh run: this many
  # AdamW steps at `warm_start_lr`, each on the hindsight expert's trajectories for `warm_start_questions`
  # training questions; the DAPO optimizer then starts fresh on the cloned parameters
  warm_start_steps: int = 0
  warm_start_questions: int = 16
  warm_start_lr: float = 1e-5
  warm_start_expert: str = "hindsight"  # the teacher (`warm_start.expert_turn`): hindsight, ladder or direct
  # a controller adapter file (`adapter.npz` of an earlier run) to start from instead of fresh adapters; its
  # rank, alpha and targets must equal lora_rank, lora_alpha and lora_targets
  init_adapter: str = ""
  # LoRA (`m3jax.models.lora`): > 0 trains rank-`lora_rank` adapters on `lora_targets` (of q k v o gate up down),
  # scaled by lora_alpha / lora_rank, with the loaded weights frozen (they are also the KL reference policy);
  # checkpoints then hold only the adapters and their optimizer state. 0 = full fine-tuning
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = LoRAConfig.targets
  # rollouts through this many continuously refilled KV-cache rows (`Controller.run(slots=...)`): a trajectory's
  # row passes to a waiting one as soon as it answers. 0 = all trajectories of a rollout as one static batch,
  # whose groups prefill their shared prompt once. Trajectories are the same either way (per-row streams)
  rollout_slots: int = 0
  # True: while the learner updates on step s's groups, a second thread rolls out step s + 1's with the parameters
  # that update starts from, so every step trains on rollouts one update behind (their old log-probs are the
  # sampler's: needs recompute_old_logp=False). Measured on 2 CPU cores only, where the two contend for both cores:
  # a real step ran 1.05x faster, inside its step-to-step spread (bench/rl_ahead.py, runs/issue45/zen4/rl_ahead.log).
  # One process only
  rollout_ahead: bool = False
  eval_every: int = 0  # 0: no held-out evaluation during training
  eval_questions: int = 32
  seed: int = 1
  out_dir: str = "runs/rl"
  save_every: int = 1
  keep_checkpoints: int = 2  # a chunk's end prunes to the newest one, the state a commit of out_dir carries
  # a run as chunks of at most `chunk.max_minutes` (m3jax.chunks): each ends between steps with its state saved
  # and `out_dir/continue.cmd`, the command that continues it
  chunk: ChunkConfig = ChunkConfig()
  # (data, fsdp, tensor) over every process's devices: the learner's batch rows are sharded over data x fsdp and
  # each process feeds its rows; rollouts then decode on a local copy of the parameters in every process.
  # None = one device (a single process only)
  mesh: tuple[int, int, int] | None = None
  distributed: DistributedConfig = DistributedConfig()  # multi-process start-up (m3jax.distributed)

  def __post_init__(self):
    if self.advantage not in ("grpo", "taura"):
      raise ValueError(f"advantage={self.advantage!r}; expected 'grpo' or 'taura'")
    if self.steps < 0 or self.batch_questions < 1 or self.group_size < 1 or self.save_every < 1:
      raise ValueError("steps >= 0, batch_questions, group_size and save_every >= 1 are required")
    if self.keep_checkpoints < 1:
      raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
    if self.unanswerable_repeat < 1:
      raise ValueError(f"unanswerable_repeat must be >= 1, got {self.unanswerable_repeat}")
    bad = [pair for pair in self.family_repeat if len(pair) != 2 or not isinstance(pair[1], int) or pair[1] < 1]
    if bad or len({f for f, _ in self.family_repeat}) != len(self.family_repeat):
      raise ValueError(f"family_repeat must hold distinct (family, k >= 1) pairs, got {self.family_repeat!r}")
    if not self.recompute_old_logp and self.learner.temperature != self.temperature:
      raise ValueError(f"recompute_old_logp=False takes the sampler's log-probs (and TAURA's entropies) at temperature "
                       f"{self.temperature} as the old policy's: learner.temperature is {self.learner.temperature}")
    if self.rollout_ahead and self.recompute_old_logp:
      raise ValueError("rollout_ahead=True trains on rollouts drawn one update earlier: set recompute_old_logp=False "
                       "so their old log-probs are those of the policy that drew them")
    if self.rollout_slots < 0:
      raise ValueError(f"rollout_slots must be >= 0, got {self.rollout_slots}")
    if self.warm_start_steps < 0 or self.warm_start_questions < 1 or self.warm_start_lr <= 0:
      raise ValueError("warm_start_steps >= 0, warm_start_questions >= 1 and warm_start_lr > 0 are required")
    self.lora  # validates the LoRA fields
    if self.warm_start_expert not in EXPERT_STYLES:
      raise ValueError(f"warm_start_expert={self.warm_start_expert!r}; expected one of {EXPERT_STYLES}")
    if self.init_adapter and not self.lora_rank:
      raise ValueError("init_adapter needs lora_rank > 0 (it holds LoRA adapters)")
    if self.outcome_judge not in JUDGES:
      raise ValueError(f"judge={self.outcome_judge!r} (judge or reward.judge); expected one of {', '.join(JUDGES)}")
    check_split(range(*self.train_seeds), "train")
    if not 0.0 <= self.pool_ratio < 1.0:
      raise ValueError(f"pool_ratio must be in [0, 1), got {self.pool_ratio}")
    if self.pool_ratio > 0:
      if self.pool_seeds[1] <= self.pool_seeds[0]:
        raise ValueError(f"pool_ratio={self.pool_ratio} needs pool_seeds=(lo, hi) with hi > lo, got {self.pool_seeds}")
      if self.embedder != "minilm":
        raise ValueError(f"the perception pool's memories are embedded with MiniLM: set embedder=\"minilm\" "
                         f"(got {self.embedder!r})")
      check_split(range(*self.pool_seeds), "train")
    check_split(range(*self.eval_seeds), "heldout")

  @property
  def outcome_judge(self) -> str:
    """The judge of the reward's outcome: `judge` when set, else `reward.judge`."""
    return self.judge or self.reward.judge

  @property
  def control(self) -> ControlConfig:
    return ControlConfig(max_rounds=self.max_rounds, inter_turn_instruction=self.inter_turn_instruction)

  @property
  def lora(self) -> LoRAConfig:
    return LoRAConfig(self.lora_rank, self.lora_alpha, self.lora_targets)
