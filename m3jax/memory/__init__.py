"""m3jax.memory"""
