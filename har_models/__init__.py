"""har_models."""
