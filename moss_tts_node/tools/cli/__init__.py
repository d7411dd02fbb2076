"""The user's commands: ``python -m moss_tts_node COMMAND`` and the ``moss_tts`` console script (``main.py``)."""
