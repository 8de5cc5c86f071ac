"""GPU validation of OFU against controlled GEMMs (run on a Hopper GPU; CPU dry run for the tests)."""
