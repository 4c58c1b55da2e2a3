"""For tests, ours and users': the pytest snapshot plugin, reference models (torch.nn), reproducible runs
and the tiny fixture model."""
