"""``python -m keepsake inspect|verify|diff|convert ...``: the bundled CLI (keepsake._cli)."""
import sys

from ._cli import main

sys.exit(main())
