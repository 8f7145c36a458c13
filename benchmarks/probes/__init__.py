"""Child programs of the benchmark, each run in a process of its own with
`python -m benchmarks.probes.<name>` so that its memory or profile is its own:

* `train_memory`: trains a compact model a few steps, then waits (section 5's VmHWM);
* `vit_b_memory`: the ViT-B/16-sized model and one trace, stage by stage (section 6);
* `profile_sape2`: `torch.profiler` table of the SaPE² layer (section 8), also against an
  older `vitpe_core` put first on `PYTHONPATH`.

They import only what they measure (no `benchmarks.bench`), and this file imports nothing.
"""
