"""Pure Flax models and their weight readers. Knows nothing about memory or agents."""
