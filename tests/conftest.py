"""Test session set-up: 8 fake CPU devices (sharding tests), float32 matmuls, offline hubs."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
