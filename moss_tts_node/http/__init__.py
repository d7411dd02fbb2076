"""HTTP: OpenAI's speech API over the core (the server: ``server.py``, on the optional ``[http]`` extra) and the
remote backend that speaks through such a server (``remote.py``, standard library only)."""
