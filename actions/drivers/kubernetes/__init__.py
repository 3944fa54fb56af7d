"""The Kubernetes driver: cordon and taint nodes, delete and re-create a job's pods."""
