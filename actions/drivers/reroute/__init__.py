"""The reroute driver: replan the flows around a link (C4P) and keep the plan in force."""
