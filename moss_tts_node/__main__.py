"""``python -m moss_tts_node``: see ``cli.py``."""

import sys

from .cli import main

sys.exit(main())
