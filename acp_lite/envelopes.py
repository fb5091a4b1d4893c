"""The typed envelopes of registered methods and their one-pass decoders (the routing's fast path),
of one line or of a block of lines read together. Rules:

- One envelope struct per method and params type, tagged by ``method``, built once per process
  (the connections of one application register the same ones). It forbids other fields and
  requires params, so a line it accepts needs no further check; anything unusual fails over to
  the general path, which knows how to complain.
- The decoders are unions even for one method (``_Unmatchable``), so a message without a
  ``method`` never decodes as the lone envelope.
- Lines the typed decoders would reject are recognised first where that is cheaper than their
  exception; a wrong guess costs time, never a different outcome.
"""

import functools
from typing import Any, List, Literal, Sequence, Tuple, Union

import msgspec
from msgspec import Struct

from .codec import strict_decoder


class _Unmatchable(Struct, tag_field="method", tag="\x00"):
    """Never decodes: a line naming its tag goes the general way like any other unknown method."""

    def __post_init__(self) -> None:
        raise ValueError("not a registered method")


@functools.cache
def envelope_type(method: str, params_type: Any, is_request: bool) -> type:
    """The envelope struct of ``method``, tagged by it for the union decoders."""
    fields = [("jsonrpc", Literal["2.0"]), ("params", params_type)]
    if is_request:
        fields.insert(1, ("id", Union[int, str, None]))
    # gc=False as for the schema's structs: a block's envelopes live together for a moment, and
    # tracked ones would cost the garbage collector passes over every one of them.
    envelope = msgspec.defstruct(
        "_Envelope", fields, tag_field="method", tag=method, forbid_unknown_fields=True, gc=False
    )
    strict_decoder(envelope)  # raises TypeError now, not in the union, for a type msgspec cannot decode
    return envelope


@functools.lru_cache(maxsize=64)
def union_decoders(envelopes: Tuple[type, ...]) -> Tuple[Any, Any]:
    """Decoders of one message and of a JSON array of messages, into the envelopes."""
    union = Union[envelopes + (_Unmatchable,)]  # type: ignore[valid-type]  # noqa: RUF005 (a type, built)
    return strict_decoder(union), strict_decoder(List[union])  # type: ignore[valid-type]


def fast_decodable(frame: Any) -> bool:
    """False for a line with invalid UTF-8, which the typed decoders must leave to the general
    path: msgspec checks the UTF-8 of the values it decodes, not of the fields it skips."""
    if type(frame) is not bytes or frame.isascii():
        return True
    try:
        frame.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def typed_decoder_may_read(frame: Any) -> bool:
    """False for a line the typed decoders would reject (see the module's rules): an answer, a
    ``_...`` extension method (they know the protocol's methods only), invalid UTF-8, an oversized frame."""
    if type(frame) is not bytes:
        return False
    at = frame.find(b'"method"')
    if at < 0 or frame.find(b'"_', at + 8, at + 13) >= 0:  # ':"_' with up to two spaces around the colon
        return False
    return frame.isascii() or fast_decodable(frame)  # (ASCII, as lines usually are: one call fewer)


def several_lines(block: Any) -> bool:
    return type(block) is bytes and block.find(b"\n") >= 0


def lines_of(block: Any) -> Sequence[Any]:
    return block.split(b"\n") if type(block) is bytes else (block,)
