"""N-ForGOT losses and the temporal Weisfeiler-Lehman relabelling (pure tensor functions)."""
