"""ACP v2 (draft), opt-in: the types of the draft the TypeScript SDK 2.4.0 ships, and both sides.

Not part of the vendored single file (``acp_lite.tools.vendor`` takes top-level modules only).
"""
