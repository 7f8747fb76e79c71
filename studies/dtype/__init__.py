"""Studies of the experiments' `--dtype`: reports/dtype/."""
