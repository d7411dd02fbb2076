"""``python -m moss_tts_node``: see ``tools/cli/main.py``."""

import sys

from moss_tts_node.tools.cli.main import main

sys.exit(main())
