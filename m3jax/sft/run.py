"""`train.py sft --config configs/<name>.py`: builds the model, the dataset and the trainer from an SFTConfig.

The model is either a Hugging Face Qwen2.5-Omni / M3-Agent-Memorization directory (fine-tuned with its own
tokenizer, loaded sharded over `mesh`) or a tiny from-scratch thinker over bytes (`TinyThinker`) for tests and
benchmarks on CPU; or, with `writer_llm`, a text LLM trained as the `llm` memory writer on real perception of
the episodes (`m3jax.sft.writer_data`), whose LoRA adapters are written to `<out_dir>/adapter` with the card
the writer loads them by (`m3jax.memorize.writers.trained_writer`).
"""

from __future__ import annotations

import dataclasses
import pathlib

from m3jax.memorize.perceive import PerceptionConfig
from m3jax.perception.asr_models import ASR_MODELS, DEFAULT_ASR
from m3jax.chunks import ChunkConfig
from m3jax.data.episodes import EpisodeConfig
from m3jax.data.questions import check_split, refuse_test_seeds
from m3jax.distributed import DistributedConfig, global_mesh
from m3jax.models.decoder import DecoderConfig
from m3jax.models.lora import LoRAConfig, attach, export_adapter_file
from m3jax.models.omni.audio import AudioConfig
from m3jax.models.omni.placeholders import SpecialTokens
from m3jax.models.omni.processor import ProcessorConfig
from m3jax.models.omni.rope import RopeIndexConfig
from m3jax.models.omni.thinker import Thinker, ThinkerConfig
from m3jax.models.omni.vision import VisionConfig
from m3jax.sft import data as sft_data
from m3jax.sft import writer_data
from m3jax.models.omni.chat import ByteTokenizer, ChatTokens
from m3jax.sft.trainer import TrainConfig, Trainer


@dataclasses.dataclass(frozen=True)
class TinyThinker:
  """Dimensions of a from-scratch thinker over ByteTokenizer ids (0..255) + 9 chat/media ids."""
  hidden: int = 64
  layers: int = 2
  heads: int = 4
  kv_heads: int = 2
  vision_hidden: int = 32
  vision_depth: int = 2
  audio_hidden: int = 32
  audio_layers: int = 2
  mel_bins: int = 128
  patch_size: int = 14

  def chat_tokens(self) -> ChatTokens:
    return ChatTokens(256, 257, SpecialTokens(image=258, video=259, audio=260, vision_bos=261, vision_eos=262,
                                              audio_bos=263, audio_eos=264))

  def thinker_config(self) -> ThinkerConfig:
    head_dim = self.hidden // self.heads
    q = head_dim // 2
    section = (q - 2 * (q // 3), q // 3, q // 3)  # t, h, w (sums to head_dim / 2)
    text = DecoderConfig(vocab_size=272, hidden_size=self.hidden, intermediate_size=2 * self.hidden,
                         num_layers=self.layers, num_heads=self.heads, num_kv_heads=self.kv_heads, head_dim=head_dim,
                         qkv_bias=True, mrope_section=section, model_type="qwen2_5_omni_text")
    vision = VisionConfig(depth=self.vision_depth, hidden_size=self.vision_hidden,
                          intermediate_size=2 * self.vision_hidden, num_heads=2, patch_size=self.patch_size,
                          out_hidden_size=self.hidden, fullatt_block_indexes=(self.vision_depth - 1,),
                          window_size=self.patch_size * 4)
    audio = AudioConfig(num_mel_bins=self.mel_bins, encoder_layers=self.audio_layers, encoder_attention_heads=2,
                        encoder_ffn_dim=2 * self.audio_hidden, d_model=self.audio_hidden, output_dim=self.hidden)
    tok = self.chat_tokens().media
    rope = RopeIndexConfig(image_token_id=tok.image, video_token_id=tok.video, audio_token_id=tok.audio,
                           vision_start_token_id=tok.vision_bos, audio_start_token_id=tok.audio_bos)
    return ThinkerConfig(text, vision, audio, rope, tok)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  out_dir: str = "runs/sft_tiny"
  data_dir: str = "runs/sft_data"
  model_dir: str | None = None  # HF Omni directory; None = a TinyThinker from scratch
  tiny: TinyThinker = TinyThinker()
  prompt: str = "reference"  # "reference" = the released model's memorization prompt, else the literal prompt
  episode: EpisodeConfig = EpisodeConfig(num_clips=2, num_characters=2)
  train_seeds: tuple[int, ...] = (1, 2, 3, 4)
  eval_seeds: tuple[int, ...] = (100,)
  processor: ProcessorConfig = ProcessorConfig()
  batch: int = 2
  length_buckets: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
  attention_chunk: int = 0  # > 0: LM / vision attention in query blocks of this size (long real clips)
  data_seed: int = 0
  init_seed: int = 0
  train: TrainConfig = TrainConfig()
  # a run as chunks of at most `chunk.max_minutes` (m3jax.chunks): each ends between steps with its state saved
  # and `out_dir/continue.cmd`, the command that continues it
  chunk: ChunkConfig = ChunkConfig()
  # LoRA on the thinker's language model (`m3jax.models.lora`): > 0 trains rank-`lora_rank` adapters on
  # `lora_targets` (scaled by lora_alpha / lora_rank) with every other weight frozen; 0 = full fine-tuning
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = LoRAConfig.targets
  progress: bool = True
  # (data, fsdp, tensor) over every process's devices: the batch rows are sharded over data x fsdp and each
  # process feeds its rows; None = one device (a single process only)
  mesh: tuple[int, int, int] | None = None
  distributed: DistributedConfig = DistributedConfig()  # multi-process start-up (m3jax.distributed)
  # the text memory writer instead of the Omni thinker: LoRA SFT of this LLM (a shipped name, an HF directory or
  # a .gguf) on (perception, gold memories) pairs of the episodes, perceived with `perception`; its prompt
  # starts with `writer_instruction` (recorded in the adapter's card). None = the Omni thinker.
  writer_llm: str | None = None
  writer_instruction: str = writer_data.WRITER_INSTRUCTION
  perception: PerceptionConfig = PerceptionConfig()
  asr: str = DEFAULT_ASR  # the Whisper model that hears the writer's episodes (`m3jax.perception.asr_models`)

  def __post_init__(self):
    if self.asr not in ASR_MODELS:
      raise ValueError(f"asr={self.asr!r}: expected one of {sorted(ASR_MODELS)}")
    self.lora  # validates the LoRA fields
    refuse_test_seeds(self.train_seeds, "SFTConfig.train_seeds")  # nor the SFT curve (eval_seeds) on the test split
    refuse_test_seeds(self.eval_seeds, "SFTConfig.eval_seeds")
    if self.writer_llm is not None:
      if self.lora_rank < 1:
        raise ValueError("the text writer trains LoRA adapters (what `--writer-adapter` loads): set lora_rank >= 1")
      check_split(self.train_seeds, "train")

  @property
  def lora(self) -> LoRAConfig:
    return LoRAConfig(self.lora_rank, self.lora_alpha, self.lora_targets)


def _prompt(cfg: SFTConfig) -> str:
  if cfg.prompt != "reference":
    return cfg.prompt
  from m3jax.memorize.writers import MEMORY_PROMPT
  return MEMORY_PROMPT


def build(cfg: SFTConfig) -> Trainer:
  if cfg.writer_llm is not None:
    return _build_writer(cfg)
  from flax import nnx
  if cfg.model_dir is None:
    tcfg = cfg.tiny.thinker_config().with_attention_chunk(cfg.attention_chunk)
    model = Thinker(tcfg, rngs=nnx.Rngs(cfg.init_seed))
    tok, chat = ByteTokenizer(), cfg.tiny.chat_tokens()
  else:
    from m3jax.models.omni.weights import load_thinker
    from m3jax.models.tokenizer import load_tokenizer
    model = load_thinker(cfg.model_dir, param_dtype="float32", compute_dtype="bfloat16",
                         attention_chunk=cfg.attention_chunk)
    tcfg = model.cfg
    hf_tok = load_tokenizer(cfg.model_dir)
    tok = _PlainEncoder(hf_tok)
    chat = ChatTokens(hf_tok.convert_tokens_to_ids("<|im_start|>"), hf_tok.convert_tokens_to_ids("<|im_end|>"),
                      tcfg.tokens)
  attach(model.lm, cfg.lora, seed=cfg.init_seed)
  work = pathlib.Path(cfg.data_dir)
  sources = {"train": sft_data.episode_source(cfg.train_seeds, work / "episodes", cfg.episode),
             "eval": sft_data.episode_source(cfg.eval_seeds, work / "episodes", cfg.episode)}
  splits = _prepare_once(work / "tfds", sources)
  spec = sft_data.BatchSpec(cfg.batch, cfg.length_buckets)
  prompt = _prompt(cfg)
  train = sft_data.batches(splits["train"], tcfg, prompt, tok, chat, cfg.processor, spec, seed=cfg.data_seed)
  evals = sft_data.batches(splits["eval"], tcfg, prompt, tok, chat, cfg.processor, spec, seed=None)
  return _trainer(cfg, model, train, evals)


def _build_writer(cfg: SFTConfig) -> Trainer:
  """The text writer's trainer: the LLM with LoRA adapters on writer_data's pairs (TextBatches)."""
  from m3jax.models.llm import load_llm
  model, tokenizer = load_llm(cfg.writer_llm)
  attach(model, cfg.lora, seed=cfg.init_seed)
  work = pathlib.Path(cfg.data_dir)
  sources = {split: writer_data.episode_pairs(seeds, work / "episodes", cfg.episode, cfg.perception, cfg.asr)
             for split, seeds in (("train", cfg.train_seeds), ("eval", cfg.eval_seeds))}
  splits = _prepare_once(work / "tfds", sources, writer_data.prepare)
  train = writer_data.text_batches(splits["train"], tokenizer, cfg.writer_instruction, cfg.batch,
                                   cfg.length_buckets, seed=cfg.data_seed)
  evals = writer_data.text_batches(splits["eval"], tokenizer, cfg.writer_instruction, cfg.batch,
                                   cfg.length_buckets, seed=None)
  return _trainer(cfg, model, train, evals)


def _trainer(cfg: SFTConfig, model, train, evals) -> Trainer:
  """A Trainer over indexable train/eval batch sources; the eval batches are materialised once, on first use."""
  eval_cache: list = []

  def eval_batches():
    if not eval_cache:
      eval_cache.extend(evals[i] for i in range(len(evals)))
    return eval_cache

  return Trainer(model, cfg.train, cfg.out_dir, lambda k: train[k], eval_batches, progress=cfg.progress,
                 mesh=_mesh(cfg), chunk=cfg.chunk)


def save_writer_adapter(cfg: SFTConfig, trainer: Trainer) -> pathlib.Path:
  """`<out_dir>/writer.npz`: the trained adapters with what `trained_writer` needs to run them (base LLM and
  instruction) and what reproduces them (steps, seeds, episode shape)."""
  import jax
  out = pathlib.Path(cfg.out_dir) / "writer.npz"
  if jax.process_index() == 0:
    meta = {"base_llm": cfg.writer_llm, "instruction": cfg.writer_instruction, "steps": trainer.step,
            "train_seeds": list(cfg.train_seeds), "episode": cfg.episode.settings_dict(), "asr": cfg.asr,
            "speaker_fps": cfg.perception.speaker_fps}
    export_adapter_file(out, trainer.model, "writer", meta)
  return out


def _prepare_once(tfds_dir: pathlib.Path, sources, prepare=sft_data.prepare) -> dict:
  """Process 0 builds the dataset, the others then open it (data_dir is shared storage on a pod, and two
  builders writing the same files would race); every process then reads its share of each batch's rows
  (`sft_data.ShardedBatches`)."""
  import jax
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    if jax.process_index() == 0:
      prepare(tfds_dir, sources)
    multihost_utils.sync_global_devices("sft dataset prepared")
  return prepare(tfds_dir, sources)


def _mesh(cfg: SFTConfig):
  import jax
  if cfg.mesh is None:
    if jax.process_count() > 1:
      raise ValueError(f"{jax.process_count()} processes joined: set mesh=(data, fsdp, tensor) over their "
                       f"{jax.device_count()} devices")
    return None
  return global_mesh(*cfg.mesh)


class _PlainEncoder:
  """HF tokenizer -> plain-text ids (special tokens are inserted by id, never parsed from text)."""

  def __init__(self, tok):
    self.tok = tok

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False)


def main(cfg: SFTConfig) -> tuple[list[dict], dict]:
  """Runs one chunk: (its records, where the run stands; m3jax.chunks). The writer's adapter file is written at
  every chunk's end, as of the step reached."""
  trainer = build(cfg)
  history = trainer.run()
  if cfg.writer_llm is not None:
    save_writer_adapter(cfg, trainer)
  return history, trainer.summary()
