"""Development: speed and fidelity measurements run by hand, and the tiny random models the tests use."""
