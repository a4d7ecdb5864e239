"""DeepSeek's Files API passed through: its routes (routes.py), the relay of its answers (passthrough.py), and
in managed mode which team owns each file (owners.py, which the gateway also asks about the file ids a
request names)."""
