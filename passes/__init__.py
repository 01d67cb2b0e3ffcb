"""FX passes: profile, problem building, partition, memory simulation (``remat.passes``)."""
