"""The benchmark harness of `python -m explorer bench [--quick]` and `bench --paper`, kept out
of the library: it writes under the repository's `assets/` and README, and runs the app. It
runs from a checkout of the repository (the command imports it from there).

- `claims`: the everyday run (`run_bench`): `accuracy`, `quality`, `overhead`, `slider`
  sections over the cases and settings of `cases`; `report`, `plots` and `markdown` write it.
- `paper`: plan quality at the paper's scale (`run_paper`) over the grid of `paper_grid`;
  `paper_report` writes it.

The `*_bench.py` scripts beside them are run as files (`python benchmarks/trace_bench.py`).
"""
