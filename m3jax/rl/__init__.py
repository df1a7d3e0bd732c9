"""m3jax.rl"""
