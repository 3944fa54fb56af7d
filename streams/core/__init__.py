"""The detection core (C4D): pure, event-time detectors; no Kafka, Faust or Redis here."""
