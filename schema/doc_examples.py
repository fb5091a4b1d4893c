"""Collect the JSON-RPC example messages of the upstream ACP v1 docs as JSON data.

Usage, from the repository root:

    python schema/doc_examples.py UPSTREAM_DOCS_V1_DIR --origin "where the pages came from" \\
        --out tests/data/doc_examples.v1.json

``tests/test_codec_docs.py`` round-trips every message through the codec. The pages' prose is
upstream's and stays out of the repository; what is kept is each fenced ``json`` block that holds a
JSON-RPC message (it names ``"jsonrpc"``), as parsed JSON, with its page and its position among the
page's ``json`` blocks (so a reason given for one example keeps pointing at it), and the sha256 of
every page read. Blocks that are not JSON (some elide values with comments) are left out.
"""

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

BLOCK = re.compile(r"```json[^\n]*\n(.*?)```", re.S)


def collect(docs: Path, origin: str) -> Dict[str, Any]:
    pages: Dict[str, str] = {}
    examples: List[Dict[str, Any]] = []
    for page in sorted(docs.glob("*.mdx")):
        raw = page.read_bytes()
        pages[page.name] = hashlib.sha256(raw).hexdigest()
        for index, match in enumerate(BLOCK.finditer(raw.decode("utf-8"))):
            if '"jsonrpc"' not in match.group(1):
                continue
            try:
                message = json.loads(match.group(1))
            except ValueError:
                continue
            examples.append({"page": page.name, "block": index, "message": message})
    return {
        "x-acp-lite-derived": {"from": origin, "by": "schema/doc_examples.py", "pages_sha256": pages},
        "examples": examples,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Collect the JSON-RPC examples of the ACP v1 docs.")
    parser.add_argument("docs", type=Path, help="the directory of the upstream v1 .mdx pages")
    parser.add_argument("--origin", required=True, help="where the pages came from (recorded in the output)")
    parser.add_argument("--out", required=True, type=Path, help="where to write the JSON file")
    args = parser.parse_args(argv)
    data = collect(args.docs, args.origin)
    text = (
        "{\n"
        + ",\n".join(
            [
                f' "x-acp-lite-derived": {json.dumps(data["x-acp-lite-derived"], ensure_ascii=False)}',
                ' "examples": [\n'
                + ",\n".join(f"  {json.dumps(e, ensure_ascii=False)}" for e in data["examples"])
                + "\n ]",
            ]
        )
        + "\n}\n"
    )
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
