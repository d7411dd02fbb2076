"""Commands around the runtime (CLI, conversion, bench, demo models, doctor); the runtime never imports these."""
