"""The shared core every layer may import: wire protocol, errors, prices, thresholds file, config schema."""
