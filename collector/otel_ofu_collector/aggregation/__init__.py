"""Aggregation: tumbling windows, the merge tier, and the loss split (on the statistics in ``stats``)."""
