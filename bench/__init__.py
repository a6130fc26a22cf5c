"""The benchmarks: each module prints one JSON object on stdout and its progress on stderr.

Run one from the repository root as ``python -m bench.<name>``; ``docs/benchmarks.md`` lists every bench
with what it measures, its command and its latest figures.  ``bench._common`` is the harness they share.
Importing the package imports nothing: ``bench.gpu`` runs where only torch, transformers and marsrl are.
"""
