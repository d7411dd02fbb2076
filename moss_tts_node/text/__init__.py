"""Text in: clean-up, splitting into pieces that fit, and the prompt matrix."""
