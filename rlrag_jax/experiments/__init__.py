"""Experiments built on `trainer.run`: each runs several configurations and compares them.

  python -m rlrag_jax.experiments.kl_stability     # k2 vs k3 KL loss at an aggressive lr
"""
