"""The promise's machinery, bottom-up: ``record`` and ``channel`` (the protocol), ``liveness``,
``watchdog``, ``hooks`` and ``waits`` (who is alive, delivering failures, every wait that can
give up), then ``context``, ``runtime`` and ``ending`` (the one context, bound to the process group
it serves, from its start to its end). Nothing here imports the public API modules above it.
"""
