"""Disaggregated serving benchmarks: `capacity` (`workbench bench pd-capacity`) and `push`
(`workbench bench pd-push`)."""
