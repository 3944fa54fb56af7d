"""The detection core (C4D): pure, event-time detectors; no Kafka, Faust or Redis here.

Its modules run compiled when ``scripts/build_native.py`` built these very sources
(`streams.core.native`), else as the Python they are.
"""

from streams.core.native import activate

NATIVE = activate(__path__)
