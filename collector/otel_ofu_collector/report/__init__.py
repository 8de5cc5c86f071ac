"""The run report: window records condensed (summary), drawn (HTML page), and the ``report`` command."""
