"""TS-LIF (Feng et al., ICLR 2025): spiking time-series forecasting with a two-compartment neuron."""

from lightning_modules.ts_lif.module import TSLIFLitModule, introduce_missing_values, neuron_summary

__all__ = ["TSLIFLitModule", "introduce_missing_values", "neuron_summary"]
