"""The pipeline a diagnosis goes through: the stages, the policy, what came of each step,
what is recorded, and the Executor interface the drivers implement (imports no driver)."""
