"""Aggregation: tumbling windows, the merge tier, and the mergeable statistics they rest on."""
