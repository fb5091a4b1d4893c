"""A skeleton editor plugin that talks to a coding agent through a vendored copy of acp_lite.

``_acp.py`` is acp_lite in one file, generated (not committed): build it with
``python -m acp_lite.tools.vendor examples/plugin/acp_plugin/_acp.py``. ``plugin.py`` is the plugin.
"""
