"""The mergeable statistics: exponential histograms, quantiles, co-moments.

Pure values and math with no part of the collector beneath them: the windows (``aggregation``) and the
merge tier fill and merge them, the values a closed window holds (``results``) carry them, and neither has
to import the other to get them.
"""
