"""The command-line tools built on the runtime: ``cli`` (argument parsing and ``run``), ``check``,
``tap``, ``wirecheck`` (the wire judge), ``benchmark`` and ``vendor``.

None of them is part of the runtime: the single-file build (``vendor``) holds the top-level modules
of ``acp_lite`` only, so nothing here is ever vendored.
"""
