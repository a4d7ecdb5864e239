"""The compatibility zoo: real client libraries run a tool loop through chatgate on default settings.

`model` holds the scenarios and the expectation table, `python_clients` the in-process drivers, `node/zoo.mjs`
and `llamaindex_client.py` the drivers run in their own runtimes, `runner` runs them and keeps what was sent.
"""
