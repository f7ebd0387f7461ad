"""Android entry point of the fedhar app (python-for-android runs main.py)."""

import sys

from edge_client.app.main import main

sys.exit(main([]))
