"""The Slurm driver: drain, resume and requeue through Slurm's CLI, and its spare pool."""
