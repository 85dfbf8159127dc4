"""vipc-analyze's words, each written once: its jobs, its export rules and the image
formats the export job writes (used by cli.py, analysis.py, jobs.py and export.py; no
imports, so the command line stays quick to start)."""

HEALTH, METRICS, EXPORT = "health", "metrics", "export"
JOBS = (HEALTH, METRICS, EXPORT)

# --export RULE:VALUE: W frames each side of every gap, frame ids divisible by N, frames at
# least S sharp (the metrics job's sharpness). The exported manifest's reason names the rule.
DROPS, EVERY, SHARP = "drops", "every", "sharp"
EXPORT_RULES = (DROPS, EVERY, SHARP)

IMAGE_FORMATS = ("jpg", "png")  # the first is the default
