"""The driver that acts on the cluster state alone: isolate marks, restart from spares."""
