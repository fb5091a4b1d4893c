"""The benchmark suite (issue 6): run it with ``python -m bench`` or ``python bench/run.py``; see run.py."""
