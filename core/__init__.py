"""The floor every package stands on: one-line user errors, seeded evaluation draws, smoke mode, weights-only
checkpoint loading and config type checks. Lightning-free; imports nothing of the suite's other packages."""
