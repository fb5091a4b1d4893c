"""What leniency costs a valid message: ``codec.decode`` against a bare cached msgspec Decoder.

    python bench/schema_decode.py [--runs 7] [--number 200000]

Decodes one valid ``session/update`` params object (an ``agent_message_chunk``) many times per run
and prints the median time per decode over the runs (each call made through a lambda, so both
sides pay the same call overhead), for:

* a bare ``msgspec.json.Decoder(SessionNotification)`` built once (the floor),
* the same behind a minimal Python function (what any wrapper costs),
* ``acp_lite.codec.decode`` (strict path: a cached decoder, then nothing else),
* for scale, the stdlib ``json.loads`` to plain dicts, and ``codec.decode`` of a message that takes
  the lenient path (an unknown ``sessionUpdate`` tag from a newer peer).
"""

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from acp_lite import codec
from acp_lite.schema import SessionNotification

VALID = json.dumps(
    {
        "sessionId": "sess_abc123def456",
        "update": {
            "sessionUpdate": "agent_message_chunk",
            "messageId": "msg_0001",
            "content": {"type": "text", "text": "I'll analyze your code for potential issues. Let me look at it."},
        },
    },
    separators=(",", ":"),
).encode()
UNKNOWN_TAG = VALID.replace(b'"agent_message_chunk"', b'"notice"')


def median_ns(decode, data: bytes, runs: int, number: int) -> float:
    """Median over ``runs`` of the mean time of one call, in nanoseconds."""
    timings = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(number):
            decode(data)
        timings.append((time.perf_counter_ns() - start) / number)
    return statistics.median(timings)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args(argv)
    logging.getLogger("acp_lite.codec").setLevel(logging.ERROR)  # the lenient case logs each fallback

    bare = msgspec.json.Decoder(SessionNotification)
    assert bare.decode(VALID) == codec.decode(VALID, SessionNotification)

    def wrapper(data, type_):  # one Python call and a dict lookup, what codec.decode adds
        return decoders[type_].decode(data)

    decoders = {SessionNotification: bare}
    cases = [
        ("msgspec.json.Decoder(SessionNotification).decode", lambda d: bare.decode(d), VALID, args.number),
        (
            "a bare Python wrapper: decoders[type_].decode(data)",
            lambda d: wrapper(d, SessionNotification),
            VALID,
            args.number,
        ),
        ("codec.decode(data, SessionNotification)", lambda d: codec.decode(d, SessionNotification), VALID, args.number),
        ("json.loads (plain dicts, for scale)", json.loads, VALID, args.number),
        (
            "codec.decode, unknown tag (lenient path)",
            lambda d: codec.decode(d, SessionNotification),
            UNKNOWN_TAG,
            max(1, args.number // 20),
        ),
    ]
    print(
        f"python {sys.version.split()[0]}, msgspec {msgspec.__version__}, {len(VALID)}-byte message, "
        f"median of {args.runs} runs"
    )
    floor = None
    for label, decode, data, number in cases:
        ns = median_ns(decode, data, args.runs, number)
        floor = floor or ns
        print(f"  {label:<52} {ns:8.0f} ns/decode  ({ns / floor:5.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
