"""Import the ACP v1 requirement list into ``spec/manifest/``, and read the manifest back.

Usage (from the repository root)::

    python -m spec.import_requirements PATH/TO/requirements.json
    python -m spec.import_requirements --check PATH/TO/requirements.json

Input: the derived ACP v1 requirement list (not part of this repository: it holds the requirements'
prose). It is one JSON object with

- ``revision`` (str), ``pinned_commit`` (str), ``schema_sha256_of_pin`` (str): which upstream
  protocol text the list was derived from;
- ``requirements``: a list of objects, each with ``n`` (1-based position), ``id`` (for example
  ``ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON``), ``keyword`` (MUST, MUST NOT, SHOULD, SHOULD NOT,
  MAY), ``role`` (agent, client, both: who the requirement binds), ``responsibility`` (sdk, shared,
  application: who can meet it), ``kind`` (how it was derived), ``text`` and ``applies_when`` (the
  requirement's prose) and ``source`` (a reference such as ``docs/protocol/v1/overview.mdx L214``).

Output, both written deterministically (same input, same bytes):

- ``spec/manifest/requirements.json``: the revision fields, ``source_sha256`` (the sha256 of the
  input file) and, in input order, each requirement's ``id``, ``keyword``, ``role``,
  ``responsibility``, ``kind`` and ``source``. The prose (``text``, ``applies_when``) stays out: the
  manifest points at it, it does not copy it.
- ``spec/manifest/classification.json``: how acp_lite meets each requirement. This file is edited
  by hand; the importer only keeps it in step with the list: it adds new ids as ``pending``, drops
  (and names) ids the list no longer has, validates every entry and rewrites it in list order.
  See ``spec/README.md`` for the statuses.

``--check`` writes nothing: it fails (status 1) when the committed manifest is not the import of
the given file.
"""

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

SPEC_DIR = Path(__file__).resolve().parent
MANIFEST_DIR = SPEC_DIR / "manifest"

KEPT_FIELDS = ("id", "keyword", "role", "responsibility", "kind", "source")
REVISION_FIELDS = ("revision", "pinned_commit", "schema_sha256_of_pin")

STATUSES = ("tested", "hook", "application", "not-applicable", "pending")
# Statuses that make a claim in words: the claim must say why.
NEEDS_WHY = ("hook", "application", "not-applicable")
ENTRY_KEYS = {"status", "why", "hook_test", "plan"}


class ManifestError(Exception):
    """The manifest or the hand-edited classification is malformed."""


def build_manifest(raw: bytes) -> Dict[str, Any]:
    """The manifest for one input document, given as the file's bytes (see the module docstring)."""
    source = json.loads(raw)
    requirements = sorted(source["requirements"], key=lambda r: r["n"])
    ids = [r["id"] for r in requirements]
    if len(set(ids)) != len(ids):
        raise ManifestError("the input lists an id twice")
    manifest = {field: source[field] for field in REVISION_FIELDS}
    manifest["source_sha256"] = hashlib.sha256(raw).hexdigest()
    manifest["requirements"] = [{field: r[field] for field in KEPT_FIELDS} for r in requirements]
    return manifest


def check_entry(req_id: str, entry: Dict[str, Any]) -> None:
    """Raise ManifestError unless ``entry`` is a well-formed classification of ``req_id``."""
    status = entry.get("status")
    if status not in STATUSES:
        raise ManifestError(f"{req_id}: status {status!r} is not one of {', '.join(STATUSES)}")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise ManifestError(f"{req_id}: unknown keys {sorted(unknown)}")
    if status in NEEDS_WHY and not entry.get("why"):
        raise ManifestError(f"{req_id}: status {status} needs a 'why'")
    if (status == "hook") != bool(entry.get("hook_test")):
        raise ManifestError(f"{req_id}: 'hook_test' names the test of a hook, and only of a hook")
    if "plan" in entry and (status != "pending" or entry["plan"] != "hook"):
        raise ManifestError(f"{req_id}: 'plan' (always \"hook\") belongs to pending entries only")


def merge_classification(manifest: Dict[str, Any], old: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """``old`` kept in step with ``manifest``: returns the new classification and the dropped ids."""
    ids = [r["id"] for r in manifest["requirements"]]
    merged = {}
    for req_id in ids:
        entry = old.get(req_id) or {"status": "pending", "why": f"new in {manifest['revision']}"}
        check_entry(req_id, entry)
        merged[req_id] = entry
    dropped = sorted(set(old) - set(ids))
    return merged, dropped


def dump_json(document: Dict[str, Any]) -> str:
    """The one layout of every committed spec JSON file: one member, or list item, per line.

    One requirement per line keeps diffs to the line that changed and the files easy to edit.
    """

    def member(value: Any) -> str:
        if isinstance(value, list):
            return "[\n" + ",\n".join("  " + _compact(item) for item in value) + "\n ]"
        return _compact(value)

    lines = [f" {_compact(key)}: {member(value)}" for key, value in document.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def load(manifest_dir: Path = MANIFEST_DIR) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The committed manifest and classification, checked to agree with each other."""
    manifest = json.loads((manifest_dir / "requirements.json").read_text(encoding="utf-8"))
    classification = json.loads((manifest_dir / "classification.json").read_text(encoding="utf-8"))
    ids = [r["id"] for r in manifest["requirements"]]
    missing = [req_id for req_id in ids if req_id not in classification]
    unknown = sorted(set(classification) - set(ids))
    if missing or unknown:
        raise ManifestError(
            f"classification.json is out of step with requirements.json (unclassified: {missing}, "
            f"unknown: {unknown}); run python -m spec.import_requirements"
        )
    for req_id in ids:
        check_entry(req_id, classification[req_id])
    return manifest, classification


DRAFT_V2 = SPEC_DIR / "draft" / "v2.json"
_DRAFT_STATUSES = ("tested", "pending")


def load_draft(path: Path = DRAFT_V2) -> Dict[str, Dict[str, Any]]:
    """The v2 draft manifest (written here, not imported: v2 has no derived list), by id. Its ids
    must not collide with v1's, and each entry needs a source line and a status."""
    document = json.loads(path.read_text(encoding="utf-8"))
    if document.get("status") != "draft":
        raise ManifestError(f"{path.name} must be marked draft")
    entries: Dict[str, Dict[str, Any]] = {}
    for entry in document["requirements"]:
        req_id = entry.get("id", "")
        if not req_id.startswith("ACP-V2-") or req_id in entries:
            raise ManifestError(f"{path.name}: bad or repeated id {req_id!r}")
        if not entry.get("source") or entry.get("status") not in _DRAFT_STATUSES:
            raise ManifestError(f"{path.name}: {req_id} needs a source and a status among {_DRAFT_STATUSES}")
        entries[req_id] = entry
    return entries


def import_file(source_path: Path, manifest_dir: Path = MANIFEST_DIR) -> List[str]:
    """Write the manifest for ``source_path`` into ``manifest_dir``; returns the dropped ids."""
    manifest = build_manifest(source_path.read_bytes())
    classification_path = manifest_dir / "classification.json"
    old = json.loads(classification_path.read_text(encoding="utf-8")) if classification_path.exists() else {}
    classification, dropped = merge_classification(manifest, old)
    manifest_dir.mkdir(parents=True, exist_ok=True)
    (manifest_dir / "requirements.json").write_text(dump_json(manifest), encoding="utf-8")
    classification_path.write_text(dump_json(classification), encoding="utf-8")
    return dropped


def check_file(source_path: Path, manifest_dir: Path = MANIFEST_DIR) -> bool:
    """Whether the committed manifest is the import of ``source_path``."""
    manifest = build_manifest(source_path.read_bytes())
    return (manifest_dir / "requirements.json").read_text(encoding="utf-8") == dump_json(manifest)


def main(argv: List[str]) -> int:
    check = argv[:1] == ["--check"]
    paths = argv[1:] if check else argv
    if len(paths) != 1:
        print("usage: python -m spec.import_requirements [--check] PATH/TO/requirements.json", file=sys.stderr)
        return 2
    if check:
        if check_file(Path(paths[0])):
            return 0
        print(f"import_requirements: spec/manifest is not the import of {paths[0]}", file=sys.stderr)
        return 1
    try:
        dropped = import_file(Path(paths[0]))
    except ManifestError as exc:
        print(f"import_requirements: {exc}", file=sys.stderr)
        return 1
    for req_id in dropped:
        print(f"dropped {req_id}: no longer in the requirement list", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
