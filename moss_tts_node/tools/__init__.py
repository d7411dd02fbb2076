"""Commands around the runtime, by audience; the runtime never imports these.

``cli/``: the user's commands. ``prepare/``: offline model preparation (not ``build/``: .gitignore, ruff
and pytest all skip folders of that name). ``dev/``: measurement by hand and the tiny test models.
``prepare/`` imports neither of the others, ``dev/`` may use ``prepare/``, and ``cli/`` dispatches to both;
``overrides.py`` is shared by ``cli/`` and ``dev/``. test/test_layout.py checks the order.
"""
