"""m3jax.agent"""
