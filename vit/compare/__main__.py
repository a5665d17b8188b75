"""``python -m vit.compare``: see ``vit.compare``."""

import sys

from vit.compare import main

sys.exit(main())
