"""The main job, ``gmm-harness``: every kernel checked in worker processes, one kernel x mode table.

``main`` parses the command line (``options``), builds the typed ``request`` and hands a kernel's cells to the
``supervisor``, which runs them in ``worker`` processes (each cell computed by ``cells``) and turns every way a
worker ends into a verdict; ``table`` renders the cells, ``document`` is the ``--json`` document, ``shards``
splits a run across machines and merges the parts, ``coverage`` is ``gmm-harness coverage``.
"""
