"""Spiking neurons (TS-LIF, LIF, TC-LIF), ATan surrogate, stability analysis and forecasting backbones."""
