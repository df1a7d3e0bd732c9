"""m3jax.perception"""
