"""Runner utilities shared by the Hydra entry points: building a run, loggers, reading runs back, claims."""
