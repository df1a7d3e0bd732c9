"""m3jax.data"""
