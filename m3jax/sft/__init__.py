"""Supervised fine-tuning of the Omni thinker as a memorizer (imitation of gold memories), and its data."""
