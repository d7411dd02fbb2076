"""``python -m moss_tts_node``: see ``tools/cli.py``."""

import sys

from moss_tts_node.tools.cli import main

sys.exit(main())
