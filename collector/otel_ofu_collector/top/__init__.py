"""``otel-ofu top``: the fleet live in a terminal.

- ``model.py``: what the screen shows (the fleet line, the job rows, a job's GPUs), built from the collector's
  closed windows and the GPUs' latest readings; pure, tested without a terminal;
- ``cells.py``: the model's numbers as the short strings and bars the table cells hold; pure;
- ``feeds.py``: where the data comes from (a collector's report feed, the demo fleet, one node's source), each
  on a thread of its own that hands updates over;
- ``app.py``: the textual application that draws the model and takes the keys;
- ``command.py``: the command line.
"""
