"""The requirement manifest in spec/manifest: a faithful, prose-free import, fully classified."""

import hashlib
import json

import pytest

from spec.import_requirements import (
    KEPT_FIELDS,
    MANIFEST_DIR,
    ManifestError,
    check_entry,
    check_file,
    dump_json,
    import_file,
    load,
    merge_classification,
)


def test_the_committed_manifest_names_its_source_and_its_classification_is_in_step():
    manifest = json.loads((MANIFEST_DIR / "requirements.json").read_text(encoding="utf-8"))
    assert manifest["source_sha256"] == "4d8b41c91663e1b46b83e36b71499710dfef5cc7551906394c8317c70c324b6f"
    assert len(manifest["requirements"]) == 240
    assert (MANIFEST_DIR / "requirements.json").read_text(encoding="utf-8") == dump_json(manifest)
    committed = json.loads((MANIFEST_DIR / "classification.json").read_text(encoding="utf-8"))
    merged, dropped = merge_classification(manifest, committed)
    assert dropped == []
    assert (MANIFEST_DIR / "classification.json").read_text(encoding="utf-8") == dump_json(merged)


def test_every_requirement_is_classified_and_no_prose_is_copied():
    manifest, classification = load()  # raises on an unclassified id or a malformed entry
    assert list(classification) == [req["id"] for req in manifest["requirements"]]
    assert all(tuple(req) == KEPT_FIELDS for req in manifest["requirements"])


def _source(*ids):
    requirements = [
        {
            "n": n,
            "id": req_id,
            "keyword": "MUST",
            "role": "both",
            "responsibility": "sdk",
            "kind": "imported",
            "text": "prose that must not be copied",
            "applies_when": None,
            "source": f"doc.mdx L{n}",
        }
        for n, req_id in enumerate(ids, 1)
    ]
    return {"revision": "r2", "pinned_commit": "c", "schema_sha256_of_pin": "s", "requirements": requirements}


def test_a_re_import_keeps_the_classification_adds_new_ids_as_pending_and_drops_vanished_ones(tmp_path):
    source_path = tmp_path / "requirements.json"
    manifest_dir = tmp_path / "manifest"
    source_path.write_text(json.dumps(_source("A", "B")), encoding="utf-8")
    assert import_file(source_path, manifest_dir) == []
    written = json.loads((manifest_dir / "requirements.json").read_text(encoding="utf-8"))
    assert written["source_sha256"] == hashlib.sha256(source_path.read_bytes()).hexdigest()
    classification_path = manifest_dir / "classification.json"
    classification = json.loads(classification_path.read_text(encoding="utf-8"))
    classification["A"] = {"status": "application", "why": "the editor's UI"}
    classification_path.write_text(dump_json(classification), encoding="utf-8")

    source_path.write_text(json.dumps(_source("C", "A")), encoding="utf-8")
    assert import_file(source_path, manifest_dir) == ["B"]

    manifest, classification = load(manifest_dir)
    assert [req["id"] for req in manifest["requirements"]] == ["C", "A"]
    assert classification == {
        "C": {"status": "pending", "why": "new in r2"},
        "A": {"status": "application", "why": "the editor's UI"},
    }
    assert "prose" not in (manifest_dir / "requirements.json").read_text(encoding="utf-8")


def test_check_tells_whether_the_committed_manifest_is_the_import_of_a_file(tmp_path):
    source_path = tmp_path / "requirements.json"
    source_path.write_text(json.dumps(_source("A")), encoding="utf-8")
    import_file(source_path, tmp_path / "manifest")
    assert check_file(source_path, tmp_path / "manifest")
    source_path.write_text(json.dumps(_source("A")) + "\n", encoding="utf-8")  # same requirements, other bytes
    assert not check_file(source_path, tmp_path / "manifest")


@pytest.mark.parametrize(
    "entry",
    [
        {"status": "done"},
        {"status": "application"},
        {"status": "not-applicable", "why": ""},
        {"status": "hook", "why": "a callback"},
        {"status": "tested", "hook_test": "tests/t.py::test_x"},
        {"status": "tested", "plan": "hook"},
        {"status": "pending", "note": "typo of why"},
    ],
)
def test_malformed_classification_entries_are_refused(entry):
    with pytest.raises(ManifestError):
        check_entry("ACP-V1-X", entry)
