"""acp_chat: a chat with a coding agent in a Vim buffer, over the Agent Client Protocol.

``_acp.py`` is acp_lite in one file, generated and not committed: build it with
``python -m acp_lite.tools.vendor examples/vim/python3/acp_chat/_acp.py``. Apart from it the
plugin needs only msgspec, installed for the Python that Vim links (see ``:py3 import sys;
print(sys.version)``). ``chat.py`` is the plugin; ``autoload/acp_chat.vim`` its Vim half.
"""
