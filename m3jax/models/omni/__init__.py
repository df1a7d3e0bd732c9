"""Qwen2.5-Omni thinker (the M3-Agent memorizer) in Flax NNX: vision + audio encoders, TMRoPE, the LM wrapper.

Host-side index planning (which tokens attend together, rotary positions) is done once per media shape in numpy
(`plan_*` functions); the device side is jitted and only sees static-shaped index arrays.
"""
