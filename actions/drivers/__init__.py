"""The drivers: the executors of the actions, one folder per system they act on."""
