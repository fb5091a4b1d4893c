"""acp_lite's conformance machinery: the requirement manifest, its importer and the coverage gate.

Not part of the shipped package; see spec/README.md.
"""
