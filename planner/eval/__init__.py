"""The models that measure C4P (benchmarks and tests only; the product never imports them).

`traffic` draws workloads, `matrices` training traffic matrices and failures, `evaluation`
compares plans with ECMP under a max-min fair bandwidth model, `baselines` the other planners.
"""
