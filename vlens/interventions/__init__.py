"""Interventions from the counting-circuit paper: the object-focused attention loss (focus) and adaptive head temperature."""
