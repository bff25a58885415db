"""Vision layers: TMRNet and the burst baselines of BracketIRE (:mod:`layers.vision.tmrnet`)."""
