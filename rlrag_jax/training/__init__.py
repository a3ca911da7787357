"""The trainer's parts: learners (rl.algo -> the update of one RL step)."""
