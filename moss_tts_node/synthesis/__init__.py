"""What the ``Synthesizer`` facade is made of: the request, the results, the stages and the pipeline."""
